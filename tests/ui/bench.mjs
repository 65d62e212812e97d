// Timings for bench/dashboard_bench.cc: how long a line printed in a guest takes to show on
// the dashboard's VM page, against a private tryboxd.
//
//   node tests/ui/bench.mjs VM LINES INTERVAL_MS
//
// A detached command in VM prints "ready", waits for a marker file, then LINES lines
// "tick N NANOSECONDS" (the guest's `date +%s%N` as it prints), INTERVAL_MS apart. The page
// records when each line reached its <pre class="output"> (a MutationObserver,
// performance.timeOrigin + performance.now(): the host's wall clock in ms); a plain reader
// of the same server-sent events outside the browser records when the line arrived there.
// Prints one JSON line, the guest's stamps as they were printed (bench/dashboard_bench.cc
// measures the guest's clock against the host's and subtracts):
//   {"page": [{"n": LINE, "seen": MS, "printed": "NS"}, ...], "sse": [...], "lines": N}
// Environment: TRYBOX_URL, TRYBOX_OPERATOR_KEY, TRYBOX_CLI (as dashboard.mjs).
import { launchBrowser, login, need, trybox, waitForText } from './lib.mjs'

const [vm, linesArg, intervalArg] = process.argv.slice(2)
if (!vm) {
  console.error('usage: node tests/ui/bench.mjs VM LINES INTERVAL_MS')
  process.exit(2)
}
const LINES = Number(linesArg || 30)
const INTERVAL = Number(intervalArg || 200)
const URL = need('TRYBOX_URL')
const KEY = need('TRYBOX_OPERATOR_KEY')
const now = () => performance.timeOrigin + performance.now()
const fail = (what) => {
  console.error(`bench.mjs: ${what}`)
  process.exit(1)
}

// A marker of this run's own: an earlier run's would let the lines start at once.
const go = `/tmp/bench-go-${process.pid}-${Date.now()}`
const script = `echo ready; while [ ! -e ${go} ]; do sleep 0.05; done; ` +
  `for i in $(seq 1 ${LINES}); do sleep ${INTERVAL / 1000}; echo "tick $i $(date +%s%N)"; done`
const started = await trybox(['exec', '-d', vm, '--', 'sh', '-c', script])
const exec = started.stdout.trim().split('\n')[0]
if (started.code !== 0 || !exec) fail(`exec -d: ${started.stderr}`)

const browser = await launchBrowser()
const sseSeen = {}
const abort = new AbortController()
try {
  const page = await browser.newPage()
  await login(page, KEY)
  await page.goto(`${URL}/#/vm/${vm}`)
  const pre = `#execs [data-exec="${exec}"] pre.output`
  if (!(await waitForText(page, pre, 'ready', 60_000))) fail(`"ready" not shown in ${pre}`)
  await page.evaluate((sel) => {
    const node = document.querySelector(sel)
    window.__seen = {}
    const scan = () => {
      const t = performance.timeOrigin + performance.now()
      for (const m of node.textContent.matchAll(/tick (\d+) (\d+)\n/g)) {
        if (!(m[1] in window.__seen)) window.__seen[m[1]] = { n: Number(m[1]), seen: t, printed: m[2] }
      }
    }
    new MutationObserver(scan).observe(node, { childList: true, characterData: true, subtree: true })
  }, pre)

  // The same lines as a plain client of the route gets them.
  const sse = fetch(`${URL}/trybox/v1/execs/${exec}/output?stream=stdout`, {
    headers: { 'X-API-KEY': KEY }, signal: abort.signal,
  }).then(async (res) => {
    if (res.status !== 200) fail(`GET /trybox/v1/execs/${exec}/output: ${res.status}`)
    let text = ''
    for await (const chunk of res.body.pipeThrough(new TextDecoderStream())) {
      const t = now()
      text += chunk
      for (const m of text.matchAll(/tick (\d+) (\d+)\\n/g)) {
        if (!(m[1] in sseSeen)) sseSeen[m[1]] = { n: Number(m[1]), seen: t, printed: m[2] }
      }
    }
  }).catch(() => {})

  const touched = await trybox(['exec', vm, '--', 'touch', go])
  if (touched.code !== 0) fail(`touch ${go}: ${touched.stderr}`)
  const all = await page.waitForFunction((n) => Object.keys(window.__seen).length >= n,
    { timeout: 60_000 + LINES * INTERVAL * 2, polling: 200 }, LINES).then(() => true, () => false)
  const seen = await page.evaluate(() => window.__seen)
  if (!all) fail(`the page showed ${Object.keys(seen).length} of ${LINES} lines`)
  abort.abort()
  await sse
  console.log(JSON.stringify({ page: Object.values(seen), sse: Object.values(sseSeen), lines: LINES }))
} finally {
  abort.abort()
  await browser.close()
}
