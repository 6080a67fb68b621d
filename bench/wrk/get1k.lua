counter = 0
request = function()
  counter = counter + 1
  wrk.headers["x-lakefront-board"] = "board-" .. (counter % 1000)
  return wrk.format("GET", "/rpc/query.execute?bytes=1024")
end
