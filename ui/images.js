// The images (#/images): each image's chain, sizes, template and use; and recipe builds
// started from here (POST /trybox/v1/image-builds), their output followed live.

import {el, table, api, act, enc, humanBytes, timeText, showError} from './lib.js';
import {openStream} from './output.js';

function templateText(t) {
  if (!t) return '—';
  const parts = [t.state];
  if (t.reason) parts.push(t.reason);
  if (t.memory_mib) parts.push(`${t.memory_mib} MiB × ${t.cpus ?? 1} CPU`);
  return parts.filter(Boolean).join(' · ');
}

function imageRow(im) {
  const derived = Array.isArray(im.derived) ? im.derived.join(', ') : (im.derived ?? '');
  return el(
    'tr',
    {'data-image': im.name, class: im.valid === false ? 'invalid' : null},
    el('th', {scope: 'row'}, im.name),
    el('td', {}, im.valid === false ? `invalid: ${im.problem ?? ''}` : 'valid'),
    el('td', {}, im.base ?? '—'),
    el('td', {}, im.parent ?? '—'),
    el('td', {class: 'num'}, im.layers ?? '—'),
    el('td', {class: 'num'}, humanBytes(im.own_bytes)),
    el('td', {class: 'num'}, humanBytes(im.total_bytes)),
    el('td', {}, templateText(im.template)),
    el('td', {class: 'num'}, im.in_use ?? 0),
    el('td', {}, derived || '—'),
    el('td', {}, im.created ? timeText(typeof im.created === 'number' ? im.created : Date.parse(im.created) / 1000) : '—'),
  );
}

// The most lines of a build's output the page keeps; older ones are dropped from view.
const MAX_BUILD_LINES = 5000;

function buildRow(b, onShow) {
  return el(
    'tr',
    {'data-build': b.id, class: b.state === 'failed' ? 'refused' : null},
    el('th', {scope: 'row'}, el('button', {type: 'button', class: 'link', onclick: () => onShow(b.id)}, b.id)),
    el('td', {}, b.name),
    el('td', {}, b.recipe),
    el('td', {class: `state state-${b.state}`}, b.state + (b.exit_code !== undefined ? ` (exit ${b.exit_code})` : '')),
    el('td', {}, timeText(b.started_at)),
    el('td', {}, b.last_line ?? ''),
  );
}

// The form that starts a build, the list of builds, and the followed build's output.
function renderBuilds(scope, onBuilt) {
  const name = el('input', {id: 'build-name', name: 'name', required: true, pattern: '[A-Za-z0-9_\\-]{1,64}', autocomplete: 'off'});
  const recipe = el('textarea', {id: 'build-recipe', rows: 6, spellcheck: 'false', placeholder: '{"from": "debian-12", "packages": ["jq"], "check": ["jq --version"]}'});
  const start = el('button', {id: 'build-start', type: 'submit'}, 'Build');
  const form = el(
    'form',
    {id: 'build-form', class: 'build-form'},
    el('label', {for: 'build-name'}, 'Image name'),
    name,
    el('label', {for: 'build-recipe'}, 'Recipe (JSON; empty: the recipe built in for that name, e.g. debian-12-dev)'),
    recipe,
    start,
  );
  const list = table('builds', ['Build', 'Image', 'Recipe', 'State', 'Started', 'Last line']);
  const title = el('h3', {id: 'build-title'});
  const cancel = el('button', {id: 'build-cancel', type: 'button', hidden: true}, 'Cancel build');
  const log = el('pre', {id: 'build-log', class: 'output', tabindex: 0, hidden: true});
  let stream = null;
  let shown = null;

  const loadList = async () => {
    const r = await api('/trybox/v1/image-builds');
    if (!scope.alive) return;
    list.body.replaceChildren(...(r.builds ?? []).map((b) => buildRow(b, show)));
  };

  function show(id) {
    stream?.close();
    shown = id;
    title.textContent = `Build ${id}`;
    log.replaceChildren();
    log.hidden = false;
    cancel.hidden = false;
    stream = openStream(`/trybox/v1/image-builds/${enc(id)}/events`, {
      line: (d) => {
        log.append(`${d.text}\n`);
        while (log.childNodes.length > MAX_BUILD_LINES) log.firstChild.remove();
      },
      end: (d) => {
        const b = d.build ?? {};
        log.append(`— ${b.state}${b.exit_code !== undefined ? ` (exit ${b.exit_code})` : ''}\n`);
        cancel.hidden = true;
        loadList().catch(() => {});
        if (b.state === 'built') onBuilt();
      },
      error: (d) => showError(d.message ?? 'the build\'s output stream failed'),
    }, {first: true});
  }
  scope.onDispose(() => stream?.close());

  form.addEventListener('submit', (e) => {
    e.preventDefault();
    act(start, async () => {
      let body = {name: name.value};
      if (recipe.value.trim() !== '') {
        try {
          body.recipe = JSON.parse(recipe.value);
        } catch (err) {
          throw new Error(`the recipe is not JSON: ${err.message}`);
        }
      }
      const r = await api('/trybox/v1/image-builds', {method: 'POST', body});
      await loadList();
      show(r.build.id);
    });
  });
  cancel.addEventListener('click', () =>
    act(cancel, async () => {
      if (shown) await api(`/trybox/v1/image-builds/${enc(shown)}/cancel`, {method: 'POST'});
    }),
  );
  scope.poll(5000, loadList, 'builds');
  return el('section', {id: 'image-builds'}, el('h2', {}, 'Build an image'), form, list.wrap, title, cancel, log);
}

export async function renderImages(main, scope) {
  const t = table('images', ['Name', 'Valid', 'Base', 'Parent', 'Layers', 'Own size', 'Total size', 'Template', 'VMs', 'Derived', 'Created']);
  const refresh = el('button', {id: 'refresh', type: 'button'}, 'Refresh');
  const where = el('p', {class: 'hint'});
  const empty = el('p', {class: 'empty', hidden: true}, 'No images are built yet.');
  main.append(el('header', {class: 'page-head'}, el('h1', {}, 'Images'), refresh), where, empty, t.wrap, renderBuilds(scope, () => load()));
  const load = () =>
    act(refresh, async () => {
      const r = await api('/trybox/v1/images');
      if (!scope.alive) return;
      const images = r.images ?? [];
      where.textContent = r.images_dir ? `From ${r.images_dir}` : '';
      empty.hidden = images.length > 0;
      t.body.replaceChildren(...images.map(imageRow));
    });
  refresh.addEventListener('click', load);
  await load();
}
