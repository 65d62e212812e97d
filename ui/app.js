// The dashboard's shell: the session, the router (the URL's fragment names the page), the
// navigation and sign-out. Each page is a function render(main, scope, ...params) in its
// own module; `scope` stops what the page started when the route changes.

import {api, setCsrf, Scope, clear, clearError, showError, el, ID_RE, requestInit, signedOut, setText, setReloader} from './lib.js';
import {renderOverview} from './overview.js';
import {renderVm} from './vm.js';
import {renderRun} from './run.js';
import {renderNetwork} from './network.js';
import {renderImages} from './images.js';

const routes = [
  {re: /^#?\/?$/, nav: '#/', render: renderOverview},
  {re: /^#\/vm\/([^/]+)$/, nav: '#/', render: renderVm},
  {re: /^#\/run\/([^/]+)$/, nav: '#/', render: renderRun},
  {re: /^#\/network$/, nav: '#/network', render: renderNetwork},
  {re: /^#\/images$/, nav: '#/images', render: renderImages},
];

let scope = null;

function notFound(main) {
  main.append(el('h1', {}, 'Not found'), el('p', {}, 'There is no such page. ', el('a', {href: '#/'}, 'Back to the overview')));
}

// Renders the page the fragment names. `focus`: move the keyboard focus to the new
// page's heading (after a navigation, not after a reload of the same page).
function route({focus = true} = {}) {
  scope?.dispose();
  scope = new Scope();
  clearError();
  const main = clear(document.getElementById('page'));
  const hash = window.location.hash || '#/';
  let page = null;
  let params = [];
  for (const r of routes) {
    const m = r.re.exec(hash);
    if (m) {
      page = r;
      params = m.slice(1).map((p) => {
        try {
          return decodeURIComponent(p);
        } catch {
          return '';
        }
      });
      break;
    }
  }
  for (const a of document.querySelectorAll('nav a')) {
    if (page && a.getAttribute('href') === page.nav) a.setAttribute('aria-current', 'page');
    else a.removeAttribute('aria-current');
  }
  if (!page || params.some((p) => !ID_RE.test(p))) {
    notFound(main);
  } else {
    const done = page.render(main, scope, ...params);
    Promise.resolve(done).catch((e) => {
      if (e.status !== 401) showError(e.message);
    });
  }
  if (focus) main.focus({preventScroll: false});
}


async function start() {
  document.getElementById('error-dismiss').addEventListener('click', () => clearError());
  document.getElementById('logout').addEventListener('click', async (e) => {
    e.currentTarget.disabled = true;
    try {
      await fetch('/ui/logout', requestInit('POST'));
    } finally {
      signedOut();
    }
  });
  try {
    const session = await api('/ui/session');
    setCsrf(session.csrf);
    setText(document.getElementById('who'), session.key?.name ? `key ${session.key.name}` : '');
  } catch (e) {
    if (e.status !== 401) showError(`the session could not be read: ${e.message}`);
    return;
  }
  setReloader(() => {
    const y = window.scrollY;
    route({focus: false});
    window.scrollTo(0, y);
  });
  window.addEventListener('hashchange', () => route());
  route({focus: false});
}

start();
