/**
 * Aggregation (medians and spreads), the machine description, the markdown tables, the SVG chart,
 * and the generated sections of bench/RESULTS.md.
 */
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { dirname } from 'node:path';
import { cpus, totalmem } from 'node:os';

export function median(values: readonly number[]): number {
  if (values.length === 0) return Number.NaN;
  const sorted = [...values].sort((a, b) => a - b);
  const mid = sorted.length >> 1;
  return sorted.length % 2 ? sorted[mid]! : (sorted[mid - 1]! + sorted[mid]!) / 2;
}

export function spread(values: readonly number[]): [number, number] {
  return [Math.min(...values), Math.max(...values)];
}

export function machine(): Record<string, string> {
  let os = 'unknown';
  try {
    os = readFileSync('/etc/os-release', 'utf8').match(/PRETTY_NAME="([^"]+)"/)?.[1] ?? os;
  } catch {
    // not Linux
  }
  let commit = 'unknown';
  try {
    commit = execFileSync('git', ['rev-parse', '--short', 'HEAD'], { encoding: 'utf8' }).trim();
  } catch {
    // not a checkout
  }
  return {
    cpu: `${cpus().length} x ${cpus()[0]?.model ?? 'unknown'}`,
    memory: `${Math.round(totalmem() / 2 ** 30)} GiB`,
    os,
    node: process.version,
    commit,
    date: new Date().toISOString(),
  };
}

/** Writes a machine-readable result file (JSON), creating its folder. */
export function writeResult(file: string, data: unknown): void {
  mkdirSync(dirname(file), { recursive: true });
  writeFileSync(file, `${JSON.stringify(data, null, 2)}\n`);
}

export function fmt(n: number, digits = 0): string {
  if (!Number.isFinite(n)) return '-';
  return n.toLocaleString('en-US', { maximumFractionDigits: digits, minimumFractionDigits: digits });
}

export function table(headers: string[], rows: string[][]): string {
  const line = (cells: string[]): string => `| ${cells.join(' | ')} |`;
  return [line(headers), line(headers.map(() => '---')), ...rows.map(line)].join('\n');
}

/** Replaces the text between `<!-- name:begin -->` and `<!-- name:end -->` (appends if absent). */
export function updateSection(file: string, name: string, body: string): void {
  const begin = `<!-- ${name}:begin -->`;
  const end = `<!-- ${name}:end -->`;
  const text = existsSync(file) ? readFileSync(file, 'utf8') : '# Benchmark results\n';
  const block = `${begin}\n${body.trim()}\n${end}`;
  const a = text.indexOf(begin);
  const b = text.indexOf(end);
  const next = a >= 0 && b > a ? text.slice(0, a) + block + text.slice(b + end.length) : `${text.trimEnd()}\n\n${block}\n`;
  writeFileSync(file, next);
}

export interface ChartSeries {
  readonly label: string;
  readonly rps: number;
  readonly p50Us: number;
  readonly p99Us: number;
  readonly p999Us: number;
}

export interface ChartGroup {
  readonly title: string;
  readonly series: readonly ChartSeries[];
}

const COLORS = ['#4e79a7', '#f28e2b', '#e15759', '#76b7b2', '#59a14f', '#edc948', '#b07aa1', '#ff9da7', '#9c755f', '#bab0ac'];

function esc(text: string): string {
  return text.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;');
}

/**
 * One row per workload: throughput bars on the left, latency percentiles (p50, p99, p99.9 on a
 * log scale) on the right, one colour per contender.
 */
export function svgChart(title: string, groups: readonly ChartGroup[]): string {
  const labels = [...new Set(groups.flatMap((g) => g.series.map((s) => s.label)))];
  const color = (label: string): string => COLORS[labels.indexOf(label) % COLORS.length]!;
  const barH = 14;
  const gap = 4;
  const leftW = 150;
  const plotW = 330;
  const latX = leftW + plotW + 60;
  const latW = 330;
  const width = latX + latW + 30;
  const out: string[] = [];
  let y = 50;
  const maxRps = Math.max(1, ...groups.flatMap((g) => g.series.map((s) => s.rps)));
  const latencies = groups.flatMap((g) => g.series.flatMap((s) => [s.p50Us, s.p99Us, s.p999Us])).filter((v) => v > 0);
  const minLat = Math.max(1, Math.min(...latencies, 100));
  const maxLat = Math.max(...latencies, 1000);
  const logX = (v: number): number => latX + (Math.log10(Math.max(v, minLat) / minLat) / Math.log10(maxLat / minLat)) * latW;
  for (const group of groups) {
    out.push(`<text x="10" y="${y - 8}" font-weight="bold">${esc(group.title)}</text>`);
    for (const s of group.series) {
      const w = (s.rps / maxRps) * plotW;
      out.push(`<text x="${leftW - 6}" y="${y + barH - 3}" text-anchor="end">${esc(s.label)}</text>`);
      out.push(`<rect x="${leftW}" y="${y}" width="${w.toFixed(1)}" height="${barH}" fill="${color(s.label)}"/>`);
      out.push(`<text x="${leftW + w + 4}" y="${y + barH - 3}">${fmt(s.rps)}/s</text>`);
      const cy = y + barH / 2;
      out.push(`<line x1="${logX(s.p50Us).toFixed(1)}" x2="${logX(s.p999Us).toFixed(1)}" y1="${cy}" y2="${cy}" stroke="${color(s.label)}" stroke-width="2"/>`);
      for (const [v, r] of [[s.p50Us, 4], [s.p99Us, 3], [s.p999Us, 2]] as const) {
        out.push(`<circle cx="${logX(v).toFixed(1)}" cy="${cy}" r="${r}" fill="${color(s.label)}"/>`);
      }
      y += barH + gap;
    }
    y += 26;
  }
  const ticks: string[] = [];
  for (let v = 10 ** Math.ceil(Math.log10(minLat)); v <= maxLat; v *= 10) {
    const x = logX(v).toFixed(1);
    ticks.push(`<line x1="${x}" x2="${x}" y1="40" y2="${y - 20}" stroke="#ddd"/>`);
    ticks.push(`<text x="${x}" y="${y - 6}" text-anchor="middle">${v >= 1000 ? `${v / 1000} ms` : `${v} us`}</text>`);
  }
  const height = y + 10;
  return [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}" font-family="sans-serif" font-size="11">`,
    `<rect width="100%" height="100%" fill="white"/>`,
    `<text x="10" y="20" font-size="14" font-weight="bold">${esc(title)}</text>`,
    `<text x="${leftW}" y="36">requests/s (median)</text>`,
    `<text x="${latX}" y="36">latency p50 (big dot), p99, p99.9 (log scale)</text>`,
    ...ticks,
    ...out,
    '</svg>',
  ].join('\n');
}
