// What dashboard.mjs and bench.mjs share: headless Chromium through puppeteer-core, signing
// in, the trybox CLI as a child process, and the PASS/FAIL lines.
import { execFile, execFileSync, spawn } from 'node:child_process'
import puppeteer from 'puppeteer-core'

export function need(name) {
  const v = process.env[name]
  if (!v) {
    console.error(`${process.argv[1]}: ${name} is not set`)
    process.exit(2)
  }
  return v
}

// $CHROMIUM, else `chromium` on the PATH (Debian's package; scripts/install-deps.sh).
export function chromiumPath() {
  if (process.env.CHROMIUM) return process.env.CHROMIUM
  try {
    return execFileSync('which', ['chromium'], { encoding: 'utf8' }).trim()
  } catch {
    console.error('no chromium on the PATH and $CHROMIUM unset: run scripts/install-deps.sh')
    process.exit(2)
  }
}

export async function launchBrowser() {
  return puppeteer.launch({
    executablePath: chromiumPath(),
    headless: true,
    // Chromium refuses to start as root with its sandbox on ("Running as root without
    // --no-sandbox is not supported"); CI runs as root.
    args: process.getuid() === 0 ? ['--no-sandbox'] : [],
  })
}

// One line per check: "PASS step.name: what was seen" or "FAIL step.name: why".
export class Report {
  constructor() {
    this.passed = 0
    this.failed = 0
  }
  pass(name, detail = '') {
    this.passed++
    console.log(`PASS ${name}${detail ? ': ' + detail : ''}`)
  }
  fail(name, reason) {
    this.failed++
    console.log(`FAIL ${name}: ${reason}`)
  }
  check(name, ok, detail, reason) {
    if (ok) this.pass(name, detail)
    else this.fail(name, reason ?? detail)
    return ok
  }
  info(name, text) {
    console.log(`INFO ${name}: ${text}`)
  }
}

export function oneLine(s, max = 300) {
  s = String(s).replace(/\s+/g, ' ')
  return s.length > max ? s.slice(0, max) + '...' : s
}

// The trybox CLI ($TRYBOX_CLI) with this process's environment (TRYBOX_HOME and the rest).
export function trybox(args, { timeout = 300_000 } = {}) {
  return new Promise((resolve) => {
    execFile(need('TRYBOX_CLI'), args, { timeout, maxBuffer: 64 << 20 }, (err, stdout, stderr) => {
      resolve({ code: err ? (typeof err.code === 'number' ? err.code : -1) : 0, stdout, stderr })
    })
  })
}

const children = new Set()
// Anything still running when this process exits is interrupted: a `trybox run` or `agent`
// CLI that gets SIGINT cancels its call and its VM goes with it.
process.on('exit', () => {
  for (const c of children) {
    try {
      c.kill('SIGINT')
    } catch {}
  }
})

// The CLI left running: its output is kept as it comes; waitFor resolves once a text
// appears in stderr or stdout.
export function spawnTrybox(args) {
  const child = spawn(need('TRYBOX_CLI'), args, { stdio: ['ignore', 'pipe', 'pipe'] })
  children.add(child)
  const r = { child, stdout: '', stderr: '', code: null, waiters: [] }
  const poke = () => {
    r.waiters = r.waiters.filter((w) => !w())
  }
  child.stdout.on('data', (d) => {
    r.stdout += d
    poke()
  })
  child.stderr.on('data', (d) => {
    r.stderr += d
    poke()
  })
  r.done = new Promise((resolve) => {
    child.on('close', (code, signal) => {
      children.delete(child)
      r.code = code ?? 128 + (signal === 'SIGINT' ? 2 : 9)
      poke()
      resolve(r.code)
    })
  })
  // Resolves with the regex's match in stderr+stdout, or null at the end or after `ms`.
  r.waitFor = (re, ms = 120_000) =>
    new Promise((resolve) => {
      const timer = setTimeout(() => resolve(null), ms)
      const test = () => {
        const m = (r.stderr + r.stdout).match(re)
        if (m || r.code !== null) {
          clearTimeout(timer)
          resolve(m)
          return true
        }
        return false
      }
      if (!test()) r.waiters.push(test)
    })
  r.stop = async () => {
    if (r.code === null) child.kill('SIGINT')
    return r.done
  }
  return r
}

// A request from outside the browser; redirects are not followed.
export async function http(method, path, { key, cookie, body, headers = {} } = {}) {
  const h = { ...headers }
  if (key) h['X-API-KEY'] = key
  if (cookie) h.Cookie = cookie
  const res = await fetch(need('TRYBOX_URL') + path, { method, headers: h, body, redirect: 'manual' })
  const text = await res.text()
  let json = null
  try {
    json = JSON.parse(text)
  } catch {}
  return { status: res.status, headers: res.headers, text, json }
}

export function sleep(ms) {
  return new Promise((r) => setTimeout(r, ms))
}

// Until fn() returns something truthy (that is returned), or null after `ms`.
export async function until(fn, ms, every = 200) {
  const end = Date.now() + ms
  for (;;) {
    const v = await fn()
    if (v) return v
    if (Date.now() > end) return null
    await sleep(every)
  }
}

// Signs in with the real form (#key, #login-submit); true once the app shell is there.
export async function login(page, key) {
  await page.goto(need('TRYBOX_URL') + '/', { waitUntil: 'load' })
  await page.waitForSelector('#key', { timeout: 15_000 })
  await page.type('#key', key)
  await Promise.all([
    page.waitForNavigation({ waitUntil: 'load', timeout: 15_000 }),
    page.click('#login-submit'),
  ])
}

// Whether some element matching `selector` has `text` in its textContent within `ms`.
export async function waitForText(page, selector, text, ms = 60_000) {
  try {
    await page.waitForFunction(
      (sel, t) => [...document.querySelectorAll(sel)].some((e) => e.textContent.includes(t)),
      { timeout: ms, polling: 'mutation' },
      selector,
      text,
    )
    return true
  } catch {
    return false
  }
}

export async function textOf(page, selector) {
  return page.evaluate(
    (sel) => [...document.querySelectorAll(sel)].map((e) => e.textContent).join('\n'),
    selector,
  )
}

// Records what a page did that it should not: dialogs (dismissed), uncaught errors, console
// errors (a CSP refusal is one).
export function watch(page) {
  const w = { dialogs: [], errors: [], console: [] }
  page.on('dialog', async (d) => {
    w.dialogs.push(`${d.type()}: ${d.message()}`)
    await d.dismiss().catch(() => {})
  })
  page.on('pageerror', (e) => w.errors.push(oneLine(e.message ?? e)))
  page.on('console', (m) => {
    if (m.type() === 'error') w.console.push(oneLine(m.text()))
  })
  return w
}
