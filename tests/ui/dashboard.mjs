// The web dashboard (docs/dashboard.md) in headless Chromium, against a private tryboxd that
// tests/e2e/dashboard_e2e_test.cc starts; it scripts the fake model before each step.
//
//   node tests/ui/dashboard.mjs [STEP...]     steps: auth live approval cancel markup screens
//                                             (none: all, in that order)
// Environment:
//   TRYBOX_URL            the daemon's HTTP server (`trybox serve`), http://127.0.0.1:PORT
//   TRYBOX_OPERATOR_KEY   a key of scope operator; TRYBOX_SANDBOX_KEY one of scope sandboxes
//   TRYBOX_CLI            the trybox binary; TRYBOX_HOME and the rest are passed on to it
//   TRYBOX_UI_SHOTS       where the screenshots go (made if missing)
//   MODEL_NAME            the model the agent runs name (the steps approval, cancel, markup,
//                         screens expect the fake model scripted as the C++ test does)
//   CHROMIUM              the browser (default: `chromium` on the PATH)
// Prints one line per check (PASS/FAIL name: words), INFO lines, RESULT lines for the C++
// side (RESULT name=value), and a last line with the counts. Exits 1 if any check failed.
import { createServer } from 'node:http'
import { execFileSync } from 'node:child_process'
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import {
  Report, need, launchBrowser, trybox, spawnTrybox, http, until, login, waitForText, textOf,
  watch, oneLine,
} from './lib.mjs'

const URL = need('TRYBOX_URL')
const OPERATOR = need('TRYBOX_OPERATOR_KEY')
const r = new Report()
const ALL = ['auth', 'live', 'approval', 'cancel', 'markup', 'screens']
const steps = process.argv.slice(2).length ? process.argv.slice(2) : ALL
for (const s of steps) {
  if (!ALL.includes(s)) {
    console.error(`dashboard.mjs: unknown step ${s} (steps: ${ALL.join(' ')})`)
    process.exit(2)
  }
}
// Nothing here may hang the suite: past this, the run fails and its children are stopped.
setTimeout(() => {
  r.fail('watchdog', 'dashboard.mjs ran for 15 minutes')
  process.exit(3)
}, 900_000).unref()

const model = () => need('MODEL_NAME')

// A page in a browser context of its own: its own cookies, so each step signs in afresh.
async function freshPage(browser) {
  const ctx = await browser.createBrowserContext()
  return ctx.newPage()
}
const RUN_RE = /trybox: run ([0-9a-f]{12})/

async function vmIds() {
  const res = await http('GET', '/trybox/v1/vms', { key: OPERATOR })
  return (res.json?.vms ?? []).map((v) => v.id)
}

// The check that markup stayed text on the page showing it: nothing ran, no element was
// made from it, and the words are there to read.
async function expectInert(page, name, literal) {
  const seen = await page.evaluate(() => ({
    pwned: typeof window.__pwned === 'undefined' ? null : String(window.__pwned),
    onerror: document.querySelectorAll('img[onerror], [onerror]').length,
    inline: [...document.querySelectorAll('script')].filter((s) => !s.src).length,
    text: document.body.innerText,
  }))
  r.check(`${name}.nothing-ran`, seen.pwned === null, 'window.__pwned is undefined',
    `window.__pwned is ${seen.pwned}: planted script ran`)
  r.check(`${name}.no-element-made`, seen.onerror === 0 && seen.inline === 0,
    'no element with onerror, no inline <script> in the DOM',
    `${seen.onerror} element(s) with onerror and ${seen.inline} inline <script> in the DOM: ` +
      'planted text was parsed as HTML')
  if (literal) {
    r.check(`${name}.shown-as-text`, seen.text.includes(literal), `innerText contains ${literal}`,
      `innerText does not contain ${literal}`)
  }
}

// ---------------------------------------------------------------------------------------------
// a. Signing in, the session cookie, CSRF and cross-site requests.
async function auth(browser) {
  const form = { 'Content-Type': 'application/x-www-form-urlencoded' }
  const loginWith = (key, headers = {}) =>
    http('POST', '/ui/login', { body: new URLSearchParams({ key }).toString(),
      headers: { ...form, ...headers } })

  for (const path of ['/', '/trybox/v1/vms', '/trybox/v1/status']) {
    const res = await http('GET', path)
    r.check(`auth.no-session ${path}`, res.status === 401, `GET ${path} without a cookie: 401`,
      `GET ${path} without a cookie answered ${res.status}, expected 401`)
    if (path === '/') {
      r.check('auth.login-page', /<form[^>]*id=["']?login/.test(res.text),
        'the 401 carries the login form (form#login)',
        `the 401's body has no form#login: ${oneLine(res.text, 200)}`)
      const csp = res.headers.get('content-security-policy') ?? ''
      const want = ["default-src 'none'", "script-src 'self'", "style-src 'self'",
        "connect-src 'self'", "frame-ancestors 'none'", "base-uri 'none'", "form-action 'self'"]
      const missing = want.filter((d) => !csp.includes(d))
      r.check('auth.csp', csp && missing.length === 0 && !csp.includes('unsafe'),
        `GET / carries Content-Security-Policy: ${csp}`,
        csp ? `the CSP on / lacks ${missing.join(', ') || 'nothing but allows unsafe-*'}: ${csp}`
          : 'GET / has no Content-Security-Policy header')
      const h = (n) => res.headers.get(n) ?? '(none)'
      r.check('auth.headers',
        h('x-content-type-options') === 'nosniff' && h('x-frame-options') === 'DENY' &&
          ['no-referrer', 'same-origin'].includes(h('referrer-policy')),
        `nosniff, X-Frame-Options DENY, Referrer-Policy ${h('referrer-policy')}`,
        `X-Content-Type-Options ${h('x-content-type-options')}, X-Frame-Options ` +
          `${h('x-frame-options')}, Referrer-Policy ${h('referrer-policy')}`)
    }
  }

  let res = await loginWith(need('TRYBOX_SANDBOX_KEY'))
  r.check('auth.sandboxes-key-refused',
    res.status === 403 && res.headers.getSetCookie().length === 0 && res.text.includes('--operator'),
    'POST /ui/login with a sandboxes key: 403 naming --operator, no cookie',
    `POST /ui/login with a sandboxes key: ${res.status}, Set-Cookie ` +
      `${JSON.stringify(res.headers.getSetCookie())}, body names --operator: ` +
      `${res.text.includes('--operator')} (expected 403, none, true)`)
  res = await loginWith('e2b_' + '0123456789'.repeat(4))
  r.check('auth.wrong-key-refused', res.status === 401 && res.headers.getSetCookie().length === 0,
    'POST /ui/login with an unknown key: 401, no cookie',
    `POST /ui/login with an unknown key: ${res.status}, Set-Cookie ` +
      `${JSON.stringify(res.headers.getSetCookie())} (expected 401, none)`)

  // The cookie as the server writes it, and a session ending with its key.
  const made = await trybox(['api-key', 'create', 'dash-removed', '--operator'])
  const removedKey = made.stdout.split('\n')[0]
  res = await loginWith(removedKey)
  const setCookie = res.headers.getSetCookie().join('; ')
  r.check('auth.set-cookie',
    res.status === 303 && res.headers.get('location') === '/' &&
      /^trybox_session=[0-9a-f]{64};/.test(setCookie) && /;\s*HttpOnly/i.test(setCookie) &&
      /;\s*SameSite=Strict/i.test(setCookie) && /;\s*Path=\/(;|$)/.test(setCookie) &&
      /;\s*Max-Age=43200/.test(setCookie),
    `303 to / with ${setCookie.replace(/=[0-9a-f]{64}/, '=<64 hex>')}`,
    `POST /ui/login with an operator key: ${res.status} Location ${res.headers.get('location')} ` +
      `Set-Cookie ${setCookie.replace(/=[0-9a-f]{64}/, '=<64 hex>') || '(none)'}`)
  const cookie = setCookie.split(';')[0]
  const before = await http('GET', '/trybox/v1/vms', { cookie })
  const foreign = await http('GET', '/trybox/v1/vms', { cookie,
    headers: { Origin: 'http://evil.example' } })
  r.check('auth.foreign-origin-get', foreign.status === 403,
    'a GET with the cookie and Origin http://evil.example: 403',
    `a GET with the cookie and Origin http://evil.example answered ${foreign.status}, expected 403`)
  await trybox(['api-key', 'rm', 'dash-removed'])
  const after = await http('GET', '/trybox/v1/vms', { cookie })
  r.check('auth.removed-key-ends-session', before.status === 200 && after.status === 401,
    'GET /trybox/v1/vms with the cookie: 200, then 401 once its key was removed',
    `GET /trybox/v1/vms with the cookie: ${before.status}, after api-key rm: ${after.status} ` +
      '(expected 200, 401)')

  // The real form, in the browser.
  const page = await freshPage(browser)
  const w = watch(page)
  await login(page, OPERATOR)
  const onOverview = await page.waitForSelector('table#vms', { timeout: 15_000 }).then(() => true,
    () => false)
  r.check('auth.form-login', onOverview && new globalThis.URL(page.url()).pathname === '/',
    `typed into #key, clicked #login-submit: at ${page.url()} with table#vms`,
    `after the form: at ${page.url()}, table#vms ${onOverview ? 'shown' : 'absent'}; ` +
      `#login-error: ${oneLine(await textOf(page, '#login-error'))}`)
  const session = (await page.browserContext().cookies()).find((c) => c.name === 'trybox_session')
  r.check('auth.cookie-flags',
    session && session.httpOnly && session.sameSite === 'Strict' && session.path === '/' &&
      /^[0-9a-f]{64}$/.test(session.value),
    'trybox_session: HttpOnly, SameSite=Strict, Path=/, 64 hex',
    session ? `trybox_session: httpOnly ${session.httpOnly}, sameSite ${session.sameSite}, path ` +
      `${session.path}, value of ${session.value.length} chars` : 'no trybox_session cookie')
  const visible = await page.evaluate(() => document.cookie)
  r.check('auth.cookie-hidden-from-script', !visible.includes('trybox_session'),
    'document.cookie does not show it', `document.cookie shows it: ${visible}`)
  const who = await page.evaluate(() =>
    fetch('/ui/session').then(async (x) => ({ status: x.status, body: await x.json() })))
  r.check('auth.session-route',
    who.status === 200 && typeof who.body.csrf === 'string' && who.body.csrf.length >= 16 &&
      who.body.key?.name === 'dash',
    `GET /ui/session: key ${who.body.key?.name} (${who.body.key?.id}), a CSRF token`,
    `GET /ui/session: ${who.status} ${JSON.stringify(who.body)}`)

  // CSRF: the same POST without and with the session's token.
  const post = (token) => page.evaluate((t) => fetch('/trybox/v1/agent-runs/000000000000/cancel', {
    method: 'POST', headers: t ? { 'X-CSRF-Token': t } : {} }).then((x) => x.status), token)
  const without = await post(null)
  const withToken = await post(who.body.csrf)
  r.check('auth.csrf-required', without === 403,
    'POST with the cookie but no X-CSRF-Token: 403',
    `POST /trybox/v1/agent-runs/000000000000/cancel with the cookie, no X-CSRF-Token: ${without}`)
  r.check('auth.csrf-accepted', withToken !== 403 && withToken !== 401,
    `the same POST with the token reaches its handler (${withToken})`,
    `the same POST with the session's X-CSRF-Token: ${withToken}`)

  // From a page of another origin (127.0.0.1, another port: the same site, so the browser
  // sends the SameSite=Strict cookie; only the Origin check stands in the way).
  const evilSeen = []
  const evil = createServer((req, res) => {
    evilSeen.push(req.headers.cookie ?? '')
    res.setHeader('Content-Type', 'text/html')
    res.end(`<!doctype html><title>elsewhere</title>
<form method="POST" action="${URL}/trybox/v1/agent-runs/x/cancel"><input name="a" value="b"></form>
<script>
fetch(${JSON.stringify(URL + '/ui/logout')}, {method: 'POST', credentials: 'include', mode: 'no-cors'})
  .catch(() => {})
  .then(() => fetch(${JSON.stringify(URL + '/trybox/v1/vms')}, {credentials: 'include', mode: 'no-cors'}))
  .catch(() => {})
  .finally(() => document.forms[0].submit())
</script>`)
  })
  await new Promise((ok) => evil.listen(0, '127.0.0.1', ok))
  const evilUrl = `http://127.0.0.1:${evil.address().port}/`
  try {
    const other = await page.browserContext().newPage()
    const answers = []
    other.on('response', (x) => {
      if (x.url().startsWith(URL)) answers.push(`${x.request().method()} ${x.url().slice(URL.length)} ${x.status()}`)
    })
    // The form is submitted once the fetch has settled: its answer comes last.
    const nav = other.waitForResponse((x) => x.url() === `${URL}/trybox/v1/agent-runs/x/cancel`,
      { timeout: 15_000 }).catch(() => null)
    await other.goto(evilUrl)
    const landed = await nav
    const logoutAnswer = answers.find((a) => a.includes('/ui/logout'))
    const formWords = landed ? oneLine(await landed.text().catch(() => ''), 160) : ''
    r.check('auth.cross-site-form', landed?.status() === 403,
      `a form on ${evilUrl} posting to /trybox/v1/agent-runs/x/cancel: 403 ${formWords}`,
      `a form on ${evilUrl} posting to /trybox/v1/agent-runs/x/cancel: ` +
        `${landed ? landed.status() + ' ' + oneLine(await landed.text().catch(() => ''), 200) : 'no answer'}`)
    const getAnswer = answers.find((a) => a.startsWith('GET /trybox/v1/vms'))
    if (getAnswer) {
      r.check('auth.cross-site-get', getAnswer.endsWith(' 403'), getAnswer,
        `a cross-site GET with the cookie got ${getAnswer}, expected 403 ("whatever its method")`)
    } else {
      r.info('auth.cross-site-get', `not observable (${answers.join('; ') || 'no response seen'})`)
    }
    if (logoutAnswer) {
      r.check('auth.cross-site-fetch', logoutAnswer.endsWith(' 403'), `${logoutAnswer}`,
        `the cross-site fetch got ${logoutAnswer}, expected 403`)
    } else {
      r.info('auth.cross-site-fetch', `the status of the cross-site POST /ui/logout was not ` +
        `observable (${answers.join('; ') || 'no response seen'})`)
    }
    await other.close()
    const still = await page.evaluate(() => fetch('/ui/session').then((x) => x.status))
    await page.reload({ waitUntil: 'load' })
    const shell = await page.waitForSelector('table#vms', { timeout: 15_000 }).then(() => true,
      () => false)
    r.check('auth.session-survives-cross-site', still === 200 && shell,
      'after the other origin\'s requests: GET /ui/session 200, the overview still shown',
      `after the other origin's requests: GET /ui/session ${still}, overview ${shell ? 'shown' : 'not shown'}`)
    if (evilSeen.some((c) => c.includes('trybox_session'))) {
      r.info('auth.cookie-scope', 'the server on another port of 127.0.0.1 was sent ' +
        'trybox_session (cookies are not scoped by port): any local web server the operator ' +
        'visits receives the session')
    }
  } finally {
    evil.close()
  }

  // Signing out ends the session on the server, not only in the browser.
  const old = (await page.browserContext().cookies()).find((c) => c.name === 'trybox_session')?.value
  await page.click('#logout').catch(() => {})
  const out = await page.waitForSelector('#key', { timeout: 15_000 }).then(() => true, () => false)
  const reused = await http('GET', '/trybox/v1/vms', { cookie: `trybox_session=${old}` })
  r.check('auth.logout', out && reused.status === 401,
    '#logout: the login form again, and the old cookie is refused (401)',
    `#logout: login form ${out ? 'shown' : 'not shown'}, the old cookie got ${reused.status}`)
  r.check('auth.no-page-errors', w.errors.length === 0 && w.dialogs.length === 0,
    'no uncaught error, no dialog', `errors: ${w.errors.join(' | ')} dialogs: ${w.dialogs.join(' | ')}`)
  await page.browserContext().close()
}

// ---------------------------------------------------------------------------------------------
// b. A command's output reaches the VM page while it runs.
async function live(browser) {
  const known = new Set(await vmIds())
  // line-1, then nothing until the test puts /tmp/go (so what the page shows before is
  // proven to be live), then a line every half second.
  const script = 'echo line-1; echo err-1 >&2; n=0; ' +
    'while [ ! -e /tmp/go ] && [ $n -lt 1800 ]; do sleep 0.1; n=$((n+1)); done; ' +
    'for i in $(seq 2 8); do echo line-$i; sleep 0.5; done'
  const run = spawnTrybox(['run', '--', 'sh', '-c', script])
  try {
    const vm = await until(async () => (await vmIds()).find((id) => !known.has(id)), 120_000)
    if (!r.check('live.vm', vm, `trybox run's VM is ${vm}`,
      `no new VM in GET /trybox/v1/vms within 120 s; trybox run: ${oneLine(run.stderr)}`)) return
    const page = await freshPage(browser)
    const w = watch(page)
    await login(page, OPERATOR)
    await page.goto(`${URL}/#/vm/${vm}`)
    const out = '#execs [data-exec] pre.output'
    const first = await waitForText(page, out, 'line-1', 60_000)
    const early = await textOf(page, out)
    if (!r.check('live.first-line', first, `line-1 in ${out} while the command waits`,
      `line-1 not in ${out} within 60 s; the page shows: ${oneLine(await textOf(page, 'main') || await textOf(page, 'body'))}`)) {
      await page.browserContext().close()
      return
    }
    r.check('live.not-ahead', !early.includes('line-2'), 'line-2 not there yet',
      `line-2 was shown before the command could print it: ${oneLine(early)}`)
    const stderr = await waitForText(page, `${out} span.stderr`, 'err-1', 10_000)
    r.check('live.stderr', stderr, 'err-1 in span.stderr',
      `err-1 not in ${out} span.stderr; the output: ${oneLine(await textOf(page, out))}`)
    const go = await trybox(['exec', vm, '--', 'touch', '/tmp/go'])
    if (go.code !== 0) r.info('live.go', `trybox exec touch /tmp/go: ${go.code} ${oneLine(go.stderr)}`)
    const third = await waitForText(page, out, 'line-3', 30_000)
    r.check('live.later-lines', third, 'line-3 appeared after line-1 was seen, with no reload',
      `line-3 not shown within 30 s of /tmp/go; the output: ${oneLine(await textOf(page, out))}`)
    const last = await waitForText(page, out, 'line-8', 30_000)
    const all = await textOf(page, out)
    const lines = all.split('\n').filter((l) => /^line-\d$/.test(l))
    r.check('live.all-lines-once',
      last && lines.join(' ') === 'line-1 line-2 line-3 line-4 line-5 line-6 line-7 line-8',
      'line-1 to line-8, each once, in order',
      `the output's lines: ${lines.join(' ') || oneLine(all)}`)
    const code = await Promise.race([run.done, until(() => run.code !== null, 60_000)])
    r.check('live.cli', run.code === 0 && /line-8/.test(run.stdout),
      'trybox run exited 0 with every line', `trybox run: ${code} ${oneLine(run.stderr)}`)
    r.check('live.no-page-errors', w.errors.length === 0 && w.dialogs.length === 0,
      'no uncaught error, no dialog', `errors: ${w.errors.join(' | ')} dialogs: ${w.dialogs.join(' | ')}`)
    await page.browserContext().close()
  } finally {
    await run.stop()
  }
}

// ---------------------------------------------------------------------------------------------
// c. A network request approved from the overview. The fake model asks for dash.test:443,
// then finishes once told.
async function approval(browser) {
  const asked = await trybox(['agent', '--image', 'debian-12', '--model', model(), '--json',
    'fetch the data from dash.test'])
  let report = null
  try {
    report = JSON.parse(asked.stdout)
  } catch {}
  if (!r.check('approval.asked', asked.code === 3 && report?.approval?.host === 'dash.test',
    `run ${report?.run} waits: NEEDS_INPUT, approval for dash.test:${report?.approval?.port}`,
    `trybox agent: ${asked.code} ${oneLine(asked.stdout || asked.stderr)}`)) return
  const run = report.run
  console.log(`RESULT approval.run=${run}`)
  const page = await freshPage(browser)
  const w = watch(page)
  await login(page, OPERATOR)
  await page.goto(`${URL}/#/`)
  const sel = `#approvals [data-approval="${run}"]`
  const shown = await page.waitForSelector(`${sel} button.approve`, { timeout: 30_000 })
    .then(() => true, () => false)
  if (!r.check('approval.listed', shown, `${sel} with button.approve in the overview`,
    `no ${sel} button.approve within 30 s; #approvals: ${oneLine(await textOf(page, '#approvals'))}`)) {
    await page.browserContext().close()
    return
  }
  const words = await textOf(page, sel)
  r.check('approval.names-host', words.includes('dash.test'), 'it names dash.test',
    `it does not name dash.test: ${oneLine(words)}`)
  await page.click(`${sel} button.approve`)
  const gone = await page.waitForFunction((s) => !document.querySelector(s), { timeout: 60_000 }, sel)
    .then(() => true, () => false)
  r.check('approval.cleared', gone, 'the approval left #approvals',
    `still in #approvals after 60 s: ${oneLine(await textOf(page, sel))}`)
  const row = await waitForText(page, `table#runs tr[data-run="${run}"]`, 'DONE', 120_000)
  r.check('approval.row-done', row, `table#runs tr[data-run=${run}] shows DONE`,
    `the run's row: ${oneLine(await textOf(page, `table#runs tr[data-run="${run}"]`)) || '(none)'}`)
  await page.goto(`${URL}/#/run/${run}`)
  const facts = await waitForText(page, '#facts', 'DONE', 30_000)
  r.check('approval.run-page-done', facts, '#facts on the run page shows DONE',
    `#facts: ${oneLine(await textOf(page, '#facts'))}`)
  const shown2 = await trybox(['agent', 'show', run, '--json'])
  let outcome = null
  try {
    outcome = JSON.parse(shown2.stdout).outcome
  } catch {}
  r.check('approval.outcome', outcome === 'DONE', 'trybox agent show: DONE',
    `trybox agent show: ${outcome ?? oneLine(shown2.stderr)}`)
  r.check('approval.no-page-errors', w.errors.length === 0 && w.dialogs.length === 0,
    'no uncaught error, no dialog', `errors: ${w.errors.join(' | ')} dialogs: ${w.dialogs.join(' | ')}`)
  await page.browserContext().close()
}

// ---------------------------------------------------------------------------------------------
// d. Cancel on the run page. The fake model runs `sleep 60`.
async function cancel(browser) {
  const cli = spawnTrybox(['agent', '--image', 'debian-12', '--model', model(), '--json',
    'wait a long time'])
  try {
    const m = await cli.waitFor(RUN_RE, 120_000)
    if (!r.check('cancel.started', m, `run ${m?.[1]} started`,
      `no run id from trybox agent: ${oneLine(cli.stderr)}`)) return
    const run = m[1]
    console.log(`RESULT cancel.run=${run}`)
    const page = await freshPage(browser)
    const w = watch(page)
    await login(page, OPERATOR)
    await page.goto(`${URL}/#/run/${run}`)
    // A command that starts after the page was drawn shows in #live (the run's events).
    const running = await waitForText(page, '#live, #calls [data-call]', 'sleep 60', 120_000)
    r.check('cancel.command-shown', running, 'the running sleep 60 is shown (#live or #calls)',
      `neither #live nor #calls shows sleep 60: ${oneLine(await textOf(page, '#live, #calls'))}`)
    const button = await page.waitForSelector('#cancel:not([disabled])', { timeout: 15_000 })
      .then(() => true, () => false)
    if (!r.check('cancel.button', button, '#cancel is there', 'no enabled #cancel on the run page')) {
      await page.browserContext().close()
      return
    }
    await page.click('#cancel')
    const done = await waitForText(page, '#facts', 'CANCELLED', 60_000)
    r.check('cancel.shown', done, '#facts shows CANCELLED',
      `#facts after #cancel: ${oneLine(await textOf(page, '#facts'))}; #error: ` +
        `${oneLine(await textOf(page, '#error:not([hidden]) .message'))}`)
    const code = await Promise.race([cli.done, until(() => cli.code !== null, 60_000)])
    r.check('cancel.cli', cli.code === 130, 'the agent CLI ended with 130 (CANCELLED)',
      `the agent CLI: ${code} ${oneLine(cli.stdout)}`)
    r.check('cancel.no-page-errors', w.errors.length === 0 && w.dialogs.length === 0,
      'no uncaught error, no dialog', `errors: ${w.errors.join(' | ')} dialogs: ${w.dialogs.join(' | ')}`)
    await page.browserContext().close()
  } finally {
    await cli.stop()
  }
}

// ---------------------------------------------------------------------------------------------
// e. Markup planted by a guest (output, a file name, a hostname in the audit) and by a model
// (a command's output, the summary) stays text.
const PLANT = {
  stdout: '<img src=x onerror="window.__pwned=1">',
  stderr: '<script>window.__pwned=2</script>',
  file: '/root/<img src=x onerror=window.__pwned=3>.txt',
  host: '<img/src=x/onerror=window.__pwned=4>',
  summary: '<img src=x onerror="window.__pwned=5;alert(5)"><script>window.__pwned=6</script> done',
  call: '<img src=x onerror=window.__pwned=7>',
}

async function markup(browser) {
  const made = await trybox(['create'])
  const vm = made.stdout.split('\n')[0]
  if (!r.check('markup.vm', made.code === 0 && /^[0-9a-f]{12}$/.test(vm), `VM ${vm}`,
    `trybox create: ${made.code} ${oneLine(made.stderr)}`)) return
  let project = null
  try {
    const q = (s) => `'${s.replace(/'/g, `'\\''`)}'`
    const plant = await trybox(['exec', vm, '--', 'sh', '-c',
      `printf '%s\\n' ${q(PLANT.stdout)}; printf '%s\\n' ${q(PLANT.stderr)} >&2; touch ${q(PLANT.file)}`])
    // A CONNECT to the guest's proxy naming a "host" of markup: refused, and audited by the
    // text it was given.
    const connect = await trybox(['exec', vm, '--', 'bash', '-c',
      'exec 3<>/dev/tcp/127.0.0.1/3128; ' +
      `printf 'CONNECT %s:443 HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n' ${q(PLANT.host)} >&3; head -c 200 <&3`])
    r.check('markup.planted', plant.code === 0 && / 403 /.test(connect.stdout),
      'output, a file and a refused CONNECT planted',
      `planting: exec ${plant.code} ${oneLine(plant.stderr)}; CONNECT: ${oneLine(connect.stdout + connect.stderr)}`)
    // The run works in a project, and its command writes the planted text into a file: the
    // run page shows the commit's patch, markup and all, as text.
    project = mkdtempSync(join(tmpdir(), 'tbx-dash-project-'))
    execFileSync('git', ['-C', project, 'init', '-q'])
    writeFileSync(join(project, 'README'), 'a project\n')
    execFileSync('git', ['-C', project, '-c', 'user.name=t', '-c', 'user.email=t@t', 'add', '.'])
    execFileSync('git', ['-C', project, '-c', 'user.name=t', '-c', 'user.email=t@t', 'commit', '-qm', 'init'])
    const agent = await trybox(['agent', '--image', 'debian-12', '--model', model(), '--json',
      '--workspace', project, 'print something'])
    let run = null
    try {
      run = JSON.parse(agent.stdout).run
    } catch {}
    r.check('markup.run', run, `run ${run} ended`, `trybox agent: ${agent.code} ${oneLine(agent.stdout + agent.stderr)}`)

    const page = await freshPage(browser)
    const w = watch(page)
    const fetchedX = []
    page.on('request', (x) => {
      const u = new globalThis.URL(x.url())
      if (u.pathname.endsWith('/x')) fetchedX.push(x.url())
    })
    await login(page, OPERATOR)

    await page.goto(`${URL}/#/vm/${vm}`)
    const out = await waitForText(page, '#execs [data-exec] pre.output', PLANT.stdout, 60_000)
    r.check('markup.vm-output', out, `${PLANT.stdout} shown in pre.output`,
      `not in #execs pre.output: ${oneLine(await textOf(page, '#execs'))}`)
    const err = await waitForText(page, '#execs [data-exec] pre.output span.stderr', PLANT.stderr, 10_000)
    r.check('markup.vm-stderr', err, `${PLANT.stderr} shown in span.stderr`,
      `not in span.stderr: ${oneLine(await textOf(page, '#execs'))}`)
    await openDir(page, '/root')
    const file = await page.waitForFunction((p) =>
      [...document.querySelectorAll('#files tr[data-path]')].some((t) => t.getAttribute('data-path') === p &&
        t.textContent.includes(p.slice(p.lastIndexOf('/') + 1))),
    { timeout: 30_000, polling: 'mutation' }, PLANT.file).then(() => true, () => false)
    r.check('markup.file-name', file, `#files tr[data-path="${PLANT.file}"] with its name as text`,
      `no such row; #files-path ${oneLine(await page.$eval('#files-path', (e) => e.value ?? e.textContent).catch(() => '(none)'))}; ` +
        `#files: ${oneLine(await textOf(page, '#files'))}`)
    const egress = await waitForText(page, '#egress-rows', PLANT.host, 30_000)
    r.check('markup.egress-host', egress, `the refused host ${PLANT.host} in #egress-rows`,
      `not in #egress-rows: ${oneLine(await textOf(page, '#egress-rows'))}`)
    await expectInert(page, 'markup.vm-page', '<img src=x')

    if (run) {
      await page.goto(`${URL}/#/run/${run}`)
      const claim = await waitForText(page, '#claim', PLANT.summary, 30_000)
      r.check('markup.claim', claim, `the summary ${PLANT.summary} in #claim`,
        `#claim: ${oneLine(await textOf(page, '#claim'))}`)
      const call = await waitForText(page, '#calls [data-call] pre.output', PLANT.call, 30_000)
      r.check('markup.call-output', call, `the command's output ${PLANT.call} in #calls pre.output`,
        `#calls: ${oneLine(await textOf(page, '#calls'))}`)
      const patch = await waitForText(page, '#diff pre.patch', `+${PLANT.call}`, 30_000)
      r.check('markup.patch', patch, `the commit's patch with +${PLANT.call} in #diff pre.patch`,
        `#diff: ${oneLine(await textOf(page, '#diff'))}`)
      await expectInert(page, 'markup.run-page', '<img src=x')
    }

    await page.goto(`${URL}/#/network`)
    const audit = await waitForText(page, '#audit', PLANT.host, 30_000)
    r.check('markup.audit-host', audit, `${PLANT.host} in #audit`, `#audit: ${oneLine(await textOf(page, '#audit'))}`)
    await expectInert(page, 'markup.network-page', '<img/src=x')

    await page.goto(`${URL}/#/`)
    await page.waitForSelector('table#vms', { timeout: 15_000 }).catch(() => {})
    await expectInert(page, 'markup.overview', null)

    r.check('markup.no-dialog', w.dialogs.length === 0, 'no dialog opened',
      `dialogs opened: ${w.dialogs.join(' | ')}`)
    r.check('markup.no-img-request', fetchedX.length === 0, 'nothing requested the planted src=x',
      `the browser fetched ${fetchedX.join(', ')}: an <img> was made from planted text`)
    const refused = w.console.filter((c) => /Content Security Policy|inline/i.test(c))
    r.check('markup.no-csp-refusal', refused.length === 0 && w.errors.length === 0,
      'no CSP refusal, no uncaught error in the console',
      `console: ${refused.concat(w.errors).join(' | ')}`)
    await page.browserContext().close()
  } finally {
    await trybox(['rm', vm])
    if (project) rmSync(project, { recursive: true, force: true })
  }
}

// The files browser at `dir`: typed into #files-path when it is a field.
async function openDir(page, dir) {
  const field = await page.waitForSelector('#files-path', { timeout: 30_000 }).catch(() => null)
  if (!field) return
  const tag = await field.evaluate((e) => e.tagName)
  if (tag !== 'INPUT') return
  await field.evaluate((e) => {
    e.value = ''
  })
  await field.type(dir)
  await field.press('Enter')
}

// ---------------------------------------------------------------------------------------------
// f. Every page at 1280x900 and 390x844, as PNGs in $TRYBOX_UI_SHOTS. The fake model asks a
// question, so the run page shows a run that waits.
async function screens(browser) {
  const dir = need('TRYBOX_UI_SHOTS')
  mkdirSync(dir, { recursive: true })
  const made = await trybox(['create'])
  const vm = made.stdout.split('\n')[0]
  if (!r.check('screens.vm', made.code === 0, `VM ${vm}`, `trybox create: ${oneLine(made.stderr)}`)) return
  let run = null
  try {
    await trybox(['exec', vm, '--', 'sh', '-c',
      'echo hello from the dashboard test; uname -a; echo a warning >&2; ' +
      'curl -sS -m 10 https://not-on-the-list.test/ || true'])
    const asked = await trybox(['agent', '--image', 'debian-12', '--model', model(), '--json',
      'write a greeting'])
    try {
      run = JSON.parse(asked.stdout).run
    } catch {}
    r.check('screens.run', asked.code === 3 && run, `run ${run} waits for an answer`,
      `trybox agent: ${asked.code} ${oneLine(asked.stdout + asked.stderr)}`)

    const pages = [
      ['overview', '/#/', `table#vms tr[data-vm="${vm}"]`],
      ['vm', `/#/vm/${vm}`, ['#execs [data-exec] pre.output', '#files tr[data-path]']],
      ['run', `/#/run/${run}`, '#facts'],
      ['network', '/#/network', '#audit'],
      ['images', '/#/images', '#images tr[data-image="debian-12"]'],
    ]
    const sizes = [['desktop', 1280, 900], ['phone', 390, 844]]
    // The login page, each time in a context of its own: no session there.
    for (const [size, width, height] of sizes) {
      const anon = await browser.createBrowserContext()
      const p = await anon.newPage()
      await p.setViewport({ width, height })
      await p.goto(`${URL}/`)
      const form = await p.waitForSelector('form#login #key', { timeout: 15_000 }).then(() => true, () => false)
      await p.screenshot({ path: `${dir}/login-${size}.png`, fullPage: true })
      r.check(`screens.login-${size}`, form, `login-${size}.png`, 'no form#login #key to show')
      await anon.close()
    }
    const ctx = await browser.createBrowserContext()
    const page = await ctx.newPage()
    const w = watch(page)
    await login(page, OPERATOR)
    // The login page itself is a 401, which Chromium logs as a failed load.
    w.console.length = 0
    for (const [size, width, height] of sizes) {
      await page.setViewport({ width, height })
      for (const [name, path, ready] of pages) {
        if (name === 'run' && !run) continue
        await page.goto(URL + path)
        // The files are listed when asked (each listing is an exec in the guest).
        if (name === 'vm') await openDir(page, '/root')
        let ok = true
        for (const sel of [ready].flat()) {
          ok &&= await page.waitForSelector(sel, { timeout: 30_000 }).then(() => true, () => false)
        }
        await page.screenshot({ path: `${dir}/${name}-${size}.png`, fullPage: true })
        const wide = await page.evaluate(() => document.documentElement.scrollWidth)
        r.check(`screens.${name}-${size}`, ok, `${name}-${size}.png (${ready} shown)`,
          `${ready} not shown within 30 s (the PNG is taken anyway); #error: ${oneLine(await textOf(page, '#error:not([hidden]) .message'))}`)
        if (wide > width) r.info(`screens.${name}-${size}`, `the page is ${wide} px wide at ${width}`)
        const error = (await textOf(page, '#error:not([hidden]) .message')).trim()
        if (error) r.info(`screens.${name}-${size}`, `#error says: ${oneLine(error)}`)
      }
    }
    r.check('screens.no-page-errors', w.errors.length === 0 && w.dialogs.length === 0 && w.console.length === 0,
      'every page: no uncaught error, no dialog, no console error',
      `errors: ${w.errors.join(' | ')} dialogs: ${w.dialogs.join(' | ')} console: ${w.console.join(' | ')}`)
    await ctx.close()
  } finally {
    if (run) await trybox(['agent', 'cancel', run])
    await trybox(['rm', vm])
  }
}

const browser = await launchBrowser()
try {
  for (const s of steps) {
    const t = Date.now()
    try {
      await { auth, live, approval, cancel, markup, screens }[s](browser)
    } catch (e) {
      r.fail(`${s}.threw`, oneLine(e.stack ?? e, 600))
    }
    r.info(s, `${((Date.now() - t) / 1000).toFixed(1)} s`)
  }
} finally {
  await browser.close()
}
console.log(`dashboard.mjs: ${r.passed} passed, ${r.failed} failed`)
process.exit(r.failed ? 1 : 0)
