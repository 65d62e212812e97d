// The dashboard's cost under load, for bench/dashboard_bench.cc --load: VMS VMs, STREAMING
// of them running a command that prints a line every 100 ms, and what tryboxd spends (CPU,
// resident memory) first with no browser, then with headless Chromium showing the overview
// and the VM page of each printing VM (their output streaming live). Chromium's own CPU and
// memory are measured too (all its processes). Prints one JSON line:
//   {"without": {...}, "with": {...}, "chromium": {...}, "lines_shown": N, "seconds": S}
// Environment: TRYBOX_URL, TRYBOX_OPERATOR_KEY, TRYBOX_CLI, TRYBOX_DAEMON_PID.
import { readFileSync, readdirSync } from 'node:fs'
import { launchBrowser, login, need, sleep, trybox } from './lib.mjs'

const [vmsArg, streamingArg, secondsArg] = process.argv.slice(2)
const VMS = Number(vmsArg || 20)
const STREAMING = Number(streamingArg || 5)
const SECONDS = Number(secondsArg || 20)
const URL = need('TRYBOX_URL')
const KEY = need('TRYBOX_OPERATOR_KEY')
const DAEMON = Number(need('TRYBOX_DAEMON_PID'))
const TICK = 100 / 1000 // /proc's clock ticks per second are 100 on Linux

const fail = (what) => {
  console.error(`load.mjs: ${what}`)
  process.exit(1)
}

// CPU seconds (user + system) and resident KiB of one process.
function usage(pid) {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8')
    const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ')
    const cpu = (Number(f[11]) + Number(f[12])) * TICK
    const rss = Number(/VmRSS:\s+(\d+)/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))?.[1] ?? 0)
    return { cpu, rss }
  } catch {
    return { cpu: 0, rss: 0 }
  }
}

// Every descendant of `root` (Chromium's renderers, GPU and utility processes).
function tree(root) {
  const parent = new Map()
  for (const d of readdirSync('/proc')) {
    if (!/^\d+$/.test(d)) continue
    try {
      const stat = readFileSync(`/proc/${d}/stat`, 'utf8')
      parent.set(Number(d), Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]))
    } catch {}
  }
  const out = [root]
  for (let i = 0; i < out.length; i++) {
    for (const [pid, ppid] of parent) if (ppid === out[i]) out.push(pid)
  }
  return out
}

// Over `seconds`: CPU as a share of one core, and the peak and mean resident MiB of `pids()`.
async function measure(pids, seconds) {
  const sum = () => pids().map(usage).reduce((a, u) => ({ cpu: a.cpu + u.cpu, rss: a.rss + u.rss }), { cpu: 0, rss: 0 })
  const first = sum()
  const t0 = performance.now()
  let peak = 0
  let total = 0
  let n = 0
  while (performance.now() - t0 < seconds * 1000) {
    await sleep(500)
    const s = sum()
    peak = Math.max(peak, s.rss)
    total += s.rss
    n++
  }
  const last = sum()
  const wall = (performance.now() - t0) / 1000
  return {
    cpu_percent_of_a_core: Math.round(((last.cpu - first.cpu) / wall) * 1000) / 10,
    rss_peak_mib: Math.round(peak / 102.4) / 10,
    rss_mean_mib: Math.round(total / n / 102.4) / 10,
  }
}

const vms = []
try {
  for (let i = 0; i < VMS; i++) {
    const r = await trybox(['create', '--quiet', '--memory', '256'])
    if (r.code !== 0) fail(`create ${i + 1} of ${VMS}: ${r.stderr}`)
    vms.push(r.stdout.trim())
  }
  // Long enough to outlast both measurements and the pages' start.
  const lines = Math.ceil((SECONDS * 2 + 60) * 10)
  for (const vm of vms.slice(0, STREAMING)) {
    const r = await trybox(['exec', '--detach', vm, '--', 'sh', '-c',
      `i=0; while [ $i -lt ${lines} ]; do echo "tick $i"; i=$((i+1)); sleep 0.1; done`])
    if (r.code !== 0) fail(`exec in ${vm}: ${r.stderr}`)
  }
  await sleep(2000)
  const without = await measure(() => [DAEMON], SECONDS)

  const browser = await launchBrowser()
  const chromium = browser.process().pid
  const pages = []
  const overview = await browser.newPage()
  await login(overview, KEY)
  pages.push(overview)
  for (const vm of vms.slice(0, STREAMING)) {
    const p = await browser.newPage()
    await p.goto(`${URL}/#/vm/${vm}`, { waitUntil: 'load' })
    pages.push(p)
  }
  // Every VM page shows its command's output before the measurement starts.
  for (const p of pages.slice(1)) {
    await p.waitForFunction(() => [...document.querySelectorAll('#execs pre.output')].some((o) => o.textContent.includes('tick')),
      { timeout: 60_000, polling: 500 })
  }
  const daemonWith = measure(() => [DAEMON], SECONDS)
  const chromiumWith = measure(() => tree(chromium), SECONDS)
  const [withDash, browserCost] = await Promise.all([daemonWith, chromiumWith])
  let shown = 0
  for (const p of pages.slice(1)) {
    shown += await p.evaluate(() => [...document.querySelectorAll('#execs pre.output')]
      .reduce((n, o) => n + (o.textContent.match(/tick/g) ?? []).length, 0))
  }
  await browser.close()
  console.log(JSON.stringify({ without, with: withDash, chromium: browserCost, lines_shown: shown, seconds: SECONDS, vms: VMS, streaming: STREAMING }))
} finally {
  for (const vm of vms) await trybox(['rm', vm])
}
