// Agent runs: their states, and answering one that waits for a person.

import {el, enc, request, showError, setText, pageLink} from './lib.js';
import {readEvents} from './output.js';

// docs/agent.md "The report": a run is RUNNING while a call works on it; the others are
// where a call left it. DONE and CANCELLED cannot be continued.
export const FINISHED = new Set(['DONE', 'CANCELLED']);

export function isRunning(outcome) {
  return !outcome || outcome === 'RUNNING';
}

// Runs this page answered whose answer stream is still open: they work, whatever their
// stored record says meanwhile.
export const answering = new Set();

// Runs seen working (their events stream had events) though not RUNNING by their record:
// a call another client made (an answer or a resume from the CLI).
export const working = new Set();

export function runState(run) {
  const id = run.run;
  return isRunning(run.outcome) || answering.has(id) || working.has(id) ? 'RUNNING' : run.outcome;
}

// A badge for an outcome or a verdict; the class picks its colour.
export function badge(text) {
  const t = text || '—';
  return el('span', {class: `badge badge-${t.toLowerCase().replace(/[^a-z_]/g, '')}`}, t);
}

// Leaving the page while an answer streams would cancel its run: the browser asks first.
window.addEventListener('beforeunload', (e) => {
  if (answering.size > 0) e.preventDefault();
});

// Answers a waiting run: {"approve": true}, {"deny": true} or {"answer": TEXT}.
//
// The answer route is a stream of the continued run's events, and the server cancels
// the run when its client goes away. So this resolves as soon as the answer is accepted
// (the 200 comes once the run has taken it) and keeps reading the body to its end in
// the background; it never cancels the reader. Errors in the stream go to the banner;
// `onEnd` is called when the stream ends.
export async function answerRun(run, body, onEnd = () => {}) {
  const res = await request(`/trybox/v1/agent-runs/${enc(run)}/answer`, {method: 'POST', body});
  answering.add(run);
  readEvents(res.body, (name, data) => {
    if (name === 'error') showError(`run ${run}: ${data?.message ?? 'the run failed'}`);
  })
    .catch(() => {
      // The connection broke: the server has cancelled the run; the page shows it.
    })
    .finally(() => {
      answering.delete(run);
      working.delete(run);
      onEnd();
    });
}

// One waiting run, with the controls that answer it. `after` refreshes the page.
// `ids`: give the controls the run page's ids (#approve, #deny, #answer-text, #answer).
export function approvalItem(a, after, {ids = false} = {}) {
  const item = el('article', {class: `approval approval-${a.state}`, 'data-approval': a.run});
  const head = el('h3', {}, a.kind === 'network' ? 'Network access' : 'A question', ' from run ', pageLink('run', a.run));
  item.append(head);
  if (a.task) item.append(el('p', {class: 'task'}, 'Task: ', el('q', {}, a.task)));
  if (a.kind === 'network') {
    item.append(
      el('p', {}, 'It asks to reach ', el('code', {}, `${a.host}:${a.port}`), '.'),
      el('p', {}, 'Its reason (the agent\u2019s words): ', el('q', {}, a.reason ?? a.question ?? '')),
    );
  } else {
    item.append(el('blockquote', {class: 'question'}, a.question ?? ''));
  }
  if (a.state !== 'pending') {
    item.append(el('p', {class: 'why'}, a.why ?? `state: ${a.state}`));
    return item;
  }
  const status = el('p', {class: 'sent', 'aria-live': 'polite'});
  const controls = () => item.querySelectorAll('button, input');
  // The controls stay disabled once the answer is taken: the next poll drops the item.
  const send = async (body, words) => {
    for (const c of controls()) c.disabled = true;
    setText(status, 'Sending…');
    try {
      await answerRun(a.run, body, after);
      setText(status, `${words}; the run goes on.`);
      after();
    } catch (e) {
      for (const c of controls()) c.disabled = false;
      setText(status, '');
      if (e.status !== 401) showError(e.message);
    }
  };
  if (a.kind === 'network') {
    const approve = el('button', {type: 'button', class: 'approve', id: ids && 'approve'}, 'Approve');
    const deny = el('button', {type: 'button', class: 'deny', id: ids && 'deny'}, 'Deny');
    approve.addEventListener('click', () => send({approve: true}, 'Approved'));
    deny.addEventListener('click', () => send({deny: true}, 'Denied'));
    item.append(el('div', {class: 'actions'}, approve, deny));
  } else {
    const label = ids ? 'answer-text' : `answer-${a.run}`;
    const input = el('input', {type: 'text', id: label, class: 'answer-text', autocomplete: 'off', required: true});
    const answer = el('button', {type: 'submit', class: 'answer', id: ids && 'answer'}, 'Answer');
    const form = el('form', {class: 'actions'}, el('label', {for: label}, 'Your answer'), input, answer);
    form.addEventListener('submit', (e) => {
      e.preventDefault();
      if (input.value.trim() !== '') send({answer: input.value}, 'Answered');
    });
    item.append(form);
  }
  item.append(status);
  return item;
}
