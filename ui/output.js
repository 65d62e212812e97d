// Command output: a capped <pre> view, the server-sent-event streams that feed it, and
// the pool that bounds how many streams are open at once.

import {el, enc, api} from './lib.js';

// A browser opens at most 6 HTTP/1.1 connections to one server, and every open
// EventSource holds one (an exec's output is one stream, both of its streams in it).
// Past that, every other request (the 2 s polls, a button) would queue behind streams
// that may run for hours. So streams share this many connections and the rest wait their
// turn; a finished stream frees its place.
const MAX_STREAMS = 4;
let open = 0;
const waiting = [];

function release() {
  open--;
  while (open < MAX_STREAMS && waiting.length > 0) {
    const start = waiting.shift();
    open++;
    start();
  }
}

// Opens `url` as an EventSource once a connection is free. `handlers` maps event names
// to functions of the parsed JSON data. Returns {close()}, which also drops a waiting
// stream. The stream closes itself on `end` and on a server `error` event; a lost
// connection (an error without data) is left to EventSource, which reconnects with
// Last-Event-ID. `onState(text)` hears "waiting", "open", "closed", "failed".
export function openStream(url, handlers, {onState = () => {}, first = false} = {}) {
  let source = null;
  let done = false;
  let counted = false;

  const close = () => {
    if (done) return;
    done = true;
    if (source) source.close();
    if (counted) release();
    else {
      const i = waiting.indexOf(start);
      if (i >= 0) waiting.splice(i, 1);
    }
  };

  function start() {
    counted = true;
    if (done) {
      release();
      return;
    }
    onState('open');
    source = new EventSource(url);
    for (const [name, fn] of Object.entries(handlers)) {
      if (name === 'error' || name === 'open') continue;
      source.addEventListener(name, (e) => {
        let data = null;
        try {
          data = JSON.parse(e.data);
        } catch {
          return; // not ours to show
        }
        fn(data, e);
        if (name === 'end') {
          close();
          onState('closed');
        }
      });
    }
    if (handlers.open) source.addEventListener('open', handlers.open);
    source.addEventListener('error', (e) => {
      if (typeof e.data === 'string') {
        // The server's own `error` event: the last one of the stream.
        let data = {};
        try {
          data = JSON.parse(e.data);
        } catch {
          data = {message: e.data};
        }
        handlers.error?.(data);
        close();
        onState('failed');
      } else if (source.readyState === EventSource.CLOSED) {
        // Refused outright (EventSource does not retry an HTTP error): maybe the session
        // ended; a call through api() finds out and signs out on a 401.
        close();
        onState('failed');
        api('/ui/session').catch(() => {});
        handlers.error?.({message: 'the stream could not be opened'});
      }
      // Otherwise EventSource is reconnecting by itself.
    });
  }

  if (open < MAX_STREAMS) {
    open++;
    start();
  } else {
    onState('waiting');
    if (first) waiting.unshift(start);
    else waiting.push(start);
  }
  return {close};
}

// The text of an `output` event: `text`, or the exact bytes of `text_b64` when they are
// not UTF-8, decoded with U+FFFD for what is not.
export function outputText(data) {
  if (typeof data.text_b64 === 'string') {
    try {
      const bin = atob(data.text_b64);
      const bytes = Uint8Array.from(bin, (c) => c.charCodeAt(0));
      return new TextDecoder('utf-8', {fatal: false}).decode(bytes);
    } catch {
      return '\uFFFD';
    }
  }
  return typeof data.text === 'string' ? data.text : '';
}

// A <pre class="output"> that keeps the newest `cap` characters; stderr goes in
// <span class="stderr">. Follows the bottom while the reader is at the bottom.
//
// Text is added once a frame, not once an event: a command printing ten lines a second
// would otherwise cost ten layouts a second (the scroll position is read and set), and
// growing one text node re-lays out all of its text each time. So each frame's output goes
// in as new nodes, one per run of a stream, and the bottom is followed once.
export class OutputView {
  constructor(cap = 256 * 1024) {
    this.cap = cap;
    this.kept = 0;
    this.pre = el('pre', {class: 'output', tabindex: '0'});
    this.dropped = null;
    this.pending = [];
    this.scheduled = false;
  }

  append(stream, text) {
    if (!text) return;
    const last = this.pending[this.pending.length - 1];
    if (last && last[0] === stream) last[1] += text;
    else this.pending.push([stream, text]);
    if (this.scheduled) return;
    this.scheduled = true;
    // The next frame, or a quarter second if no frame comes first: a tab in the background
    // gets no animation frames, and its output must still land (and be capped).
    requestAnimationFrame(() => this.flush());
    setTimeout(() => this.flush(), 250);
  }

  flush() {
    if (!this.scheduled) return;  // the other of the two calls came first
    this.scheduled = false;
    if (this.pending.length === 0) return;
    const pre = this.pre;
    const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
    for (const [stream, text] of this.pending.splice(0)) {
      pre.appendChild(stream === 'stderr' ? el('span', {class: 'stderr'}, text) : document.createTextNode(text));
      this.kept += text.length;
    }
    this.trim();
    if (atBottom) pre.scrollTop = pre.scrollHeight;
  }

  // A line of ours (a gap, an error), set apart from the command's output.
  note(text) {
    if (this.scheduled) this.flush();  // after the output that came before it
    this.pre.appendChild(el('span', {class: 'note'}, `[${text}]\n`));
  }

  trim() {
    if (this.kept <= this.cap) return;
    if (!this.dropped) {
      this.dropped = el('span', {class: 'note'}, '[earlier output not shown]\n');
      this.pre.insertBefore(this.dropped, this.pre.firstChild);
    }
    let node = this.dropped.nextSibling;
    while (node && this.kept > this.cap) {
      const next = node.nextSibling;
      const len = node.textContent.length;
      if (node.nodeType === Node.ELEMENT_NODE && node.classList.contains('note')) {
        node.remove();
      } else if (this.kept - len >= this.cap) {
        node.remove();
        this.kept -= len;
      } else {
        const cut = this.kept - this.cap;
        const textNode = node.nodeType === Node.TEXT_NODE ? node : node.firstChild;
        textNode.deleteData(0, cut);
        this.kept -= cut;
      }
      node = next;
    }
  }
}

// Fills `view` from an exec's kept output, following it while it runs. Both streams come
// in one server-sent-event stream (?stream=both), in the order the daemon read them, so
// stdout and stderr keep their order on every load and an exec holds one connection.
// An ended exec with no output opens nothing. Returns {close(), done: Promise}, which
// resolves when the stream has ended.
export function followExec(scope, execId, view, {stdoutBytes = null, stderrBytes = null, running = true, first = false} = {}) {
  if (!running && stdoutBytes === 0 && stderrBytes === 0) {
    return {close: () => {}, done: Promise.resolve(true)};
  }
  let finish;
  const done = new Promise((resolve) => (finish = resolve));
  const url = `/trybox/v1/execs/${enc(execId)}/output?stream=both`;
  const s = openStream(
    url,
    {
      output: (d) => view.append(d.stream === 'stderr' ? 'stderr' : 'stdout', outputText(d)),
      gap: (d) => view.note(`${d.stream ?? 'output'}: bytes ${d.from}–${d.to} were not kept`),
      end: () => finish(true),
      error: (d) => {
        view.note(d.message ?? 'the stream failed');
        finish(false);
      },
    },
    {
      first,
      onState: (state) => {
        if (state === 'waiting') view.pre.classList.add('waiting');
        else view.pre.classList.remove('waiting');
      },
    },
  );
  const close = () => s.close();
  scope.onDispose(close);
  return {close, done};
}

// Reads a text/event-stream body to its end, calling onEvent(name, data) for each event.
export async function readEvents(body, onEvent) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buf = '';
  let name = 'message';
  let data = [];
  for (;;) {
    const {value, done} = await reader.read();
    if (done) break;
    buf += value;
    let nl;
    while ((nl = buf.indexOf('\n')) >= 0) {
      const line = buf.slice(0, nl).replace(/\r$/, '');
      buf = buf.slice(nl + 1);
      if (line === '') {
        if (data.length > 0) {
          let parsed = null;
          try {
            parsed = JSON.parse(data.join('\n'));
          } catch {
            // Not JSON: ignored.
          }
          onEvent(name, parsed);
        }
        name = 'message';
        data = [];
      } else if (line.startsWith('event:')) {
        name = line.slice(6).trim();
      } else if (line.startsWith('data:')) {
        data.push(line.slice(5).replace(/^ /, ''));
      }
    }
  }
}
