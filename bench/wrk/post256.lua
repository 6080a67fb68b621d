wrk.method = "POST"
wrk.body = string.rep("a", 256)
wrk.headers["content-type"] = "application/json"
counter = 0
request = function()
  counter = counter + 1
  wrk.headers["x-lakefront-board"] = "board-" .. (counter % 1000)
  return wrk.format(nil, "/rpc/board.append")
end
