// The dashboard's small toolkit: building DOM, calling the API, the error banner, the
// lifetime of a page (its pollers and streams), and formatting.
//
// Everything that reaches the page from a guest or a model is text: el() turns strings
// into text nodes and sets attributes with setAttribute, never parses HTML.

const SVG_NS = 'http://www.w3.org/2000/svg';

function build(node, attrs, children) {
  for (const [name, value] of Object.entries(attrs ?? {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name.startsWith('on')) {
      // Handlers only as functions: an "onclick" string attribute would be inline script.
      if (typeof value !== 'function') throw new Error(`el: ${name} must be a function`);
      node.addEventListener(name.slice(2), value);
    } else if (name === 'style') {
      throw new Error('el: no style attributes (the CSP forbids them); use a class');
    } else {
      node.setAttribute(name, value === true ? '' : String(value));
    }
  }
  append(node, children);
  return node;
}

// Appends strings (as text), numbers, nodes and arrays of them; skips null and false.
function append(node, children) {
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    if (Array.isArray(child)) append(node, child);
    else if (child instanceof Node) node.appendChild(child);
    else node.appendChild(document.createTextNode(String(child)));
  }
  return node;
}

// el('a', {href: '#/', class: 'x'}, 'text', otherNode)
export function el(tag, attrs, ...children) {
  return build(document.createElement(tag), attrs, children);
}

export function svg(tag, attrs, ...children) {
  return build(document.createElementNS(SVG_NS, tag), attrs, children);
}

export function clear(node) {
  node.replaceChildren();
  return node;
}

// A table inside a wrapper that scrolls sideways on a narrow screen.
export function table(id, headings) {
  const body = el('tbody');
  const t = el('table', {id}, el('thead', {}, el('tr', {}, headings.map((h) => el('th', {scope: 'col'}, h)))), body);
  return {wrap: el('div', {class: 'table-wrap'}, t), table: t, body};
}

// Keeps `container`'s children in step with `items` without rebuilding what did not
// change, so a poll every 2 s neither loses the keyboard focus nor text being typed.
// make(item) builds a node; sig(item) is a string that changes when the node must be
// rebuilt; update(node, item), if given, fills a new node and refreshes a kept one.
export function syncChildren(container, items, {key, sig, make, update}) {
  const old = new Map();
  for (const node of container.children) if (node.dashKey !== undefined) old.set(node.dashKey, node);
  const wanted = items.map((item) => {
    const k = key(item);
    const s = sig ? sig(item) : '';
    let node = old.get(k);
    if (node && node.dashSig === s) {
      old.delete(k);
    } else {
      node = make(item);
      node.dashKey = k;
      node.dashSig = s;
    }
    update?.(node, item);
    return node;
  });
  for (const node of old.values()) node.remove();
  // Only moves what is out of place: moving a node takes the focus away from it.
  wanted.forEach((node, i) => {
    if (container.children[i] !== node) container.insertBefore(node, container.children[i] ?? null);
  });
  for (const node of [...container.children]) if (node.dashKey === undefined) node.remove();
}

// Sets a node's text only when it differs (keeps selections and screen readers quiet).
export function setText(node, text) {
  const s = String(text ?? '');
  if (node.textContent !== s) node.textContent = s;
}

// --- The session and the API ---

let csrf = '';

export function setCsrf(token) {
  csrf = token;
}


// The session ended (a 401 from any call): "/" shows the login page.
export function signedOut() {
  window.location.assign('/');
}

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

export function requestInit(method, body) {
  const headers = {};
  if (method !== 'GET' && method !== 'HEAD') headers['X-CSRF-Token'] = csrf;
  // A POST under the policy no-referrer carries `Origin: null`, which the server refuses
  // as cross-site; same-origin sends our origin to ourselves and nothing elsewhere.
  const init = {method, headers, credentials: 'same-origin', referrerPolicy: 'same-origin'};
  if (body !== undefined) {
    headers['Content-Type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  return init;
}

// The message of a failed answer: the JSON's `message` when there is one.
export async function errorOf(res) {
  const text = await res.text().catch(() => '');
  let message = '';
  try {
    message = JSON.parse(text)?.message ?? '';
  } catch {
    // Not JSON: fall through to the status line.
  }
  return new ApiError(res.status, message || `${res.status} ${res.statusText || 'error'}`.trim());
}

// One JSON call. Throws ApiError with the server's message; a 401 signs out.
export async function api(path, {method = 'GET', body} = {}) {
  const res = await request(path, {method, body});
  const text = await res.text();
  return text ? JSON.parse(text) : null;
}

// One call whose answer is read by the caller (a stream): the response once its status
// says it was accepted. Throws as api() does.
export async function request(path, {method = 'GET', body} = {}) {
  let res;
  try {
    res = await fetch(path, requestInit(method, body));
  } catch (e) {
    throw new ApiError(0, `the server could not be reached (${e.message})`);
  }
  if (res.status === 401) {
    signedOut();
    throw new ApiError(401, 'the session has ended');
  }
  if (!res.ok) throw await errorOf(res);
  return res;
}

// Path segments built from ids always go through encodeURIComponent.
export const enc = encodeURIComponent;

// Ids as the daemon makes them; anything else in a URL fragment is refused, not used.
export const ID_RE = /^[A-Za-z0-9_-]{1,64}$/;

// Shows the current page again from fresh data (after an action); set by app.js.
let reloader = () => {};

export function setReloader(fn) {
  reloader = fn;
}

export function reload() {
  reloader();
}

// --- The error banner ---

// `source` names who showed the message, so a poll that succeeds again clears only its
// own failure and not an action's.
let errorSource = null;

// #error holds the message alone; the bar around it holds the dismiss button too.
export function showError(message, source = 'action') {
  const text = document.getElementById('error');
  setText(text, message);
  text.parentElement.hidden = false;
  errorSource = source;
}

export function clearError(source) {
  if (source !== undefined && source !== errorSource) return;
  const text = document.getElementById('error');
  text.parentElement.hidden = true;
  setText(text, '');
  errorSource = null;
}

// Runs an action from a button: disables it meanwhile, shows a failure in the banner.
export async function act(button, fn) {
  button.disabled = true;
  try {
    await fn();
  } catch (e) {
    if (e.status !== 401) showError(e.message);
  } finally {
    button.disabled = false;
  }
}

// --- A page's lifetime ---

// Owns what a page started: pollers, streams, listeners. dispose() stops them all when
// the route changes, so nothing of an old page keeps calling the server.
export class Scope {
  #disposers = [];
  #alive = true;

  get alive() {
    return this.#alive;
  }

  onDispose(fn) {
    if (this.#alive) this.#disposers.push(fn);
    else fn();
  }

  dispose() {
    this.#alive = false;
    for (const fn of this.#disposers.splice(0).reverse()) {
      try {
        fn();
      } catch (e) {
        console.error(e);
      }
    }
  }

  // Calls fn now and then `ms` after each call ends (never two at once), only while the
  // document is visible: a hidden tab makes no requests, and catches up when shown.
  poll(ms, fn, source = 'poll') {
    let timer = null;
    let running = false;
    const tick = async () => {
      timer = null;
      if (!this.#alive || running || document.hidden) return;
      running = true;
      try {
        await fn();
        clearError(source);
      } catch (e) {
        if (this.#alive && e.status !== 401) showError(e.message, source);
      } finally {
        running = false;
      }
      if (this.#alive && !document.hidden) timer = setTimeout(tick, ms);
    };
    const onVisible = () => {
      if (!document.hidden && timer === null) tick();
    };
    document.addEventListener('visibilitychange', onVisible);
    this.onDispose(() => {
      document.removeEventListener('visibilitychange', onVisible);
      if (timer !== null) clearTimeout(timer);
    });
    tick();
    return {now: () => {
      if (timer !== null) clearTimeout(timer);
      tick();
    }};
  }
}

// --- Formatting ---

export function humanBytes(n) {
  if (n === null || n === undefined || !Number.isFinite(Number(n))) return '—';
  let v = Number(n);
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  while (Math.abs(v) >= 1024 && i < units.length - 1) {
    v /= 1024;
    i++;
  }
  return i === 0 ? `${v} B` : `${v.toFixed(v < 10 ? 1 : 0)} ${units[i]}`;
}

export function humanDuration(seconds) {
  if (seconds === null || seconds === undefined || !Number.isFinite(seconds)) return '—';
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${s % 60}s`;
  if (s < 86400) return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
  return `${Math.floor(s / 86400)}d ${Math.floor((s % 86400) / 3600)}h`;
}

export function humanMs(ms) {
  if (ms === null || ms === undefined) return '—';
  return ms < 1000 ? `${Math.round(ms)} ms` : humanDuration(ms / 1000);
}

export const nowSeconds = () => Date.now() / 1000;

// Times on the wire are seconds since the epoch.
export function timeText(seconds) {
  if (!seconds) return '—';
  return new Date(seconds * 1000).toLocaleString();
}

export function shortTime(seconds) {
  if (!seconds) return '—';
  return new Date(seconds * 1000).toLocaleTimeString();
}

// An argv as a person would type it: plain words bare, the rest single-quoted.
export function argvText(argv) {
  if (!Array.isArray(argv)) return String(argv ?? '');
  return argv.map((a) => (/^[A-Za-z0-9_@%+=:,./-]+$/.test(a) ? a : `'${String(a).replaceAll("'", "'\\''")}'`)).join(' ');
}

// How an exec ended, from a `ps` row, a report command or an exec result.
export function execEnding(x) {
  if (!x) return '';
  if (x.state === 'running' || x.outcome === 'running') return 'running';
  switch (x.outcome) {
    case 'exited':
      return `exit ${x.exit_code}`;
    case 'signaled':
      return `signal ${x.signal}`;
    case 'timed_out':
      return 'timed out';
    case 'error':
      return `error: ${x.error ?? ''}${x.message ? ` (${x.message})` : ''}`;
    default:
      return x.outcome ?? '';
  }
}

// A link to one of our own pages; the id is encoded, never trusted as a path.
export function pageLink(kind, id, text = id) {
  return el('a', {href: `#/${kind}/${enc(id)}`}, text);
}
