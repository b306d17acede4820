// The hub's page: devices, sessions, approvals. Plain DOM, no framework. Every piece of
// data goes into the DOM as text (textContent), never as markup; the login's CSRF token
// (from <meta name="csrf-token">) goes with every change.
'use strict';
(function () {
  const CSRF = meta('csrf-token');
  const MESH_URL = meta('cortex-mesh-url') || 'ws://HUB-HOST:3002/mesh/v1';
  const NARROW = window.matchMedia('(max-width: 600px)');
  const view = document.getElementById('view');
  let route = null; // the current route: {name, arg, token, cleanup: [fn]}
  let routeSeq = 0;

  function meta(name) {
    const m = document.querySelector('meta[name="' + name + '"]');
    return m ? m.getAttribute('content') : '';
  }

  // el('div', {class: 'x', 'data-test': 'y'}, 'text', child, ...): an element; strings
  // become text nodes, so data never becomes markup.
  function el(tag, attrs) {
    const e = document.createElement(tag);
    if (attrs) {
      for (const k in attrs) {
        const v = attrs[k];
        if (v === null || v === undefined || v === false) continue;
        if (k === 'onclick' || k === 'onsubmit' || k === 'oninput' || k === 'onkeydown') e[k] = v;
        else if (k === 'text') e.textContent = v;
        else e.setAttribute(k, v === true ? '' : String(v));
      }
    }
    for (let i = 2; i < arguments.length; i++) append(e, arguments[i]);
    return e;
  }
  // Replaces the view's content; null and false are left out.
  function show() {
    deviceIndex = null;
    view.replaceChildren.apply(view, Array.prototype.filter.call(arguments, function (n) { return n !== null && n !== undefined && n !== false; }));
  }
  function append(parent, c) {
    if (c === null || c === undefined || c === false) return;
    if (Array.isArray(c)) { c.forEach(function (x) { append(parent, x); }); return; }
    parent.appendChild(typeof c === 'string' || typeof c === 'number' ? document.createTextNode(String(c)) : c);
  }

  // ------------------------------------------------------------------ the API

  async function api(method, path, body) {
    const opts = { method: method, credentials: 'same-origin', headers: {} };
    if (method !== 'GET' && method !== 'HEAD') opts.headers['X-CSRF-Token'] = CSRF;
    if (body !== undefined) {
      opts.headers['Content-Type'] = 'application/json';
      opts.body = JSON.stringify(body);
    }
    const resp = await fetch(path, opts);
    if (resp.status === 401) { location.reload(); throw new Error('logged out'); }
    let data = null;
    const text = await resp.text();
    if (text) { try { data = JSON.parse(text); } catch (e) { data = null; } }
    if (!resp.ok) {
      const err = new Error((data && data.message) || ('HTTP ' + resp.status));
      err.status = resp.status;
      throw err;
    }
    return data;
  }

  function toast(msg, bad) {
    const t = document.getElementById('toast');
    t.textContent = msg;
    t.className = 'toast' + (bad ? ' bad' : '');
    t.hidden = false;
    clearTimeout(toast.timer);
    toast.timer = setTimeout(function () { t.hidden = true; }, 5000);
  }

  // ------------------------------------------------------------------ time words

  function ago(ms) {
    if (!ms) return 'never';
    const s = Math.max(0, Math.round((Date.now() - ms) / 1000));
    if (s < 60) return s + 's ago';
    if (s < 3600) return Math.floor(s / 60) + 'm ago';
    if (s < 172800) return Math.floor(s / 3600) + 'h ago';
    return Math.floor(s / 86400) + 'd ago';
  }
  // "3h", "12m", "2d": the time left until `ms`, rounded.
  function left(ms) {
    const d = ms - Date.now();
    if (d <= 0) return '0m';
    const m = Math.round(d / 60000);
    if (m < 60) return Math.max(m, 1) + 'm';
    const h = Math.round(d / 3600000);
    if (h < 48) return h + 'h';
    return Math.round(d / 86400000) + 'd';
  }
  function clock(ms) {
    if (!ms) return '';
    const d = new Date(ms);
    return d.toLocaleString();
  }

  // ------------------------------------------------------------------ confirmation

  // An in-page dialog; resolves true for yes.
  function confirmDialog(question, yes) {
    return new Promise(function (resolve) {
      const old = document.querySelector('[data-test=confirm]');
      if (old) old.remove();
      function done(v) { box.remove(); resolve(v); }
      const box = el('div', { class: 'overlay', 'data-test': 'confirm', role: 'dialog', 'aria-modal': 'true' },
        el('div', { class: 'dialog' },
          el('p', { text: question }),
          el('div', { class: 'actions' },
            el('button', { type: 'button', class: 'ghost', 'data-test': 'confirm-no', onclick: function () { done(false); } }, 'Cancel'),
            el('button', { type: 'button', class: 'danger', 'data-test': 'confirm-yes', onclick: function () { done(true); } }, yes || 'Yes'))));
      document.body.appendChild(box);
      box.querySelector('[data-test=confirm-no]').focus();
    });
  }

  // ------------------------------------------------------------------ the hub's events

  // One stream for the whole page: devices going online and offline, added, revoked.
  let hubStream = null;
  let deviceRefresh = null;
  function openHubStream() {
    if (hubStream) return;
    hubStream = new EventSource('/api/events');
    hubStream.addEventListener('event', function (m) {
      let ev;
      try { ev = JSON.parse(m.data); } catch (e) { return; }
      onHubEvent(ev);
    });
    hubStream.onopen = function () { document.getElementById('live').className = 'live on'; };
    hubStream.onerror = function () { document.getElementById('live').className = 'live'; };
  }
  function onHubEvent(ev) {
    if (!ev || !ev.device) return;
    const rows = [];
    const row = findDevice(ev.device);
    if (row) rows.push(row);
    if (route && route.name === 'device' && route.arg === ev.device) {
      const d = view.querySelector('[data-test=device-detail]');
      if (d) rows.push(d);
    }
    if (ev.kind === 'device-online' || ev.kind === 'device-offline') {
      const state = ev.kind === 'device-online' ? 'online' : 'offline';
      rows.forEach(function (r) {
        r.setAttribute('data-state', state);
        const s = r.querySelector('[data-test=device-state]');
        if (s) s.textContent = state + ' · since ' + ago(ev.ts);
      });
    }
    if (rows.length || ev.kind === 'device-added' || ev.kind === 'device-revoked') {
      clearTimeout(deviceRefresh);
      deviceRefresh = setTimeout(refreshDevices, 300);
    }
  }
  // The device list's rows by name, rebuilt when the list is (not a selector per event:
  // the stream replays the hub's whole history when it opens).
  let deviceIndex = null;
  function findDevice(name) {
    if (!deviceIndex) {
      deviceIndex = new Map();
      view.querySelectorAll('[data-test=device]').forEach(function (r) { deviceIndex.set(r.getAttribute('data-name'), r); });
    }
    return deviceIndex.get(name) || null;
  }
  function cssEscape(s) {
    return window.CSS && CSS.escape ? CSS.escape(s) : String(s).replace(/["\\]/g, '\\$&');
  }
  function refreshDevices() {
    if (!route) return;
    const r = route;
    const done = function (e) {
      if (r !== route || !e) return;
      if (e.status === 404 && r.name === 'device') show(el('p', { class: 'empty' }, 'Device ' + r.arg + ' is gone (revoked). '), el('a', { href: '#/devices' }, 'All devices'));
    };
    if (r.name === 'devices') loadDevices(r, true).catch(done);
    else if (r.name === 'device') loadDevice(r, true).catch(done);
  }

  // ------------------------------------------------------------------ routing

  function parseHash() {
    const h = location.hash.replace(/^#\/?/, '');
    const i = h.indexOf('/');
    const name = i < 0 ? h : h.slice(0, i);
    const arg = i < 0 ? '' : decodeURIComponent(h.slice(i + 1));
    if (['devices', 'device', 'sessions', 'session', 'approvals'].indexOf(name) < 0) return { name: 'devices', arg: '' };
    return { name: name, arg: arg };
  }

  function go() {
    if (route) route.cleanup.forEach(function (f) { try { f(); } catch (e) { /* gone */ } });
    const r = parseHash();
    route = { name: r.name, arg: r.arg, token: ++routeSeq, cleanup: [] };
    document.body.removeAttribute('data-ready');
    document.querySelectorAll('nav a').forEach(function (a) {
      const t = a.getAttribute('data-test').replace('nav-', '');
      a.classList.toggle('here', t === r.name || t === r.name + 's');
    });
    show(el('p', { class: 'loading' }, 'Loading…'));
    const load = { devices: loadDevices, device: loadDevice, sessions: loadSessions, session: loadSession, approvals: loadApprovals }[r.name];
    const mine = route;
    load(mine, false).then(function () {
      if (mine === route) document.body.setAttribute('data-ready', '1');
    }, function (e) {
      if (mine !== route) return;
      show(el('p', { class: 'error' }, 'Could not load: ' + e.message));
      document.body.setAttribute('data-ready', '1');
    });
    refreshApprovalCount();
  }

  function every(r, ms, f) {
    const t = setInterval(function () { if (r === route) f(); }, ms);
    r.cleanup.push(function () { clearInterval(t); });
  }

  // ------------------------------------------------------------------ devices

  function hostWords(h) {
    if (!h) return 'unknown host';
    let s = h.hostname + ' · ' + h.kernel + ' · ' + h.cpus + ' CPUs';
    if (h.gpus && h.gpus.length) s += ' · ' + h.gpus.join(', ');
    return s;
  }
  function fillDevice(row, d) {
    const f = row.cells || (row.cells = {
      state: row.querySelector('[data-test=device-state]'), seen: row.querySelector('[data-test=device-last-seen]'),
      version: row.querySelector('[data-test=device-version]'), host: row.querySelector('[data-test=device-host]'),
      spool: row.querySelector('[data-test=device-spool]'), waits: row.querySelector('[data-test=device-waits]'),
      why: row.querySelector('.why'),
    });
    row.setAttribute('data-state', d.state);
    f.state.textContent = d.state + (d.hub ? ' on ' + d.hub : '') + ' · since ' + (d.since ? ago(d.since) : 'unknown');
    f.seen.textContent = 'seen ' + ago(d.last_seen);
    f.version.textContent = d.agent_version ? 'agent ' + d.agent_version : 'agent ?';
    f.host.textContent = hostWords(d.host);
    f.spool.textContent = d.spool.pending + ' pending · ' + d.spool.bad + ' bad';
    if (d.spool.bad > 0) f.spool.classList.add('warn'); else f.spool.classList.remove('warn');
    f.waits.textContent = d.waits + (d.waits === 1 ? ' wait' : ' waits');
    f.why.textContent = d.state !== 'online' && d.offline_reason ? d.offline_reason : '';
  }
  function deviceRow(d) {
    const c = {
      state: el('span', { class: 'state', 'data-test': 'device-state' }), why: el('span', { class: 'why' }),
      seen: el('span', { class: 'seen', 'data-test': 'device-last-seen' }), version: el('span', { class: 'version', 'data-test': 'device-version' }),
      host: el('span', { class: 'host', 'data-test': 'device-host' }), spool: el('span', { class: 'spool', 'data-test': 'device-spool' }),
      waits: el('span', { class: 'waits', 'data-test': 'device-waits' }),
    };
    const row = el('div', { class: 'device', 'data-test': 'device', 'data-name': d.name, 'data-state': d.state },
      el('span', { class: 'state-dot', 'aria-hidden': 'true' }),
      el('a', { class: 'name', href: '#/device/' + encodeURIComponent(d.name) }, d.name),
      c.state, c.why, c.seen, c.version, c.host, c.spool, c.waits);
    row.cells = c;
    fillDevice(row, d);
    return row;
  }
  async function loadDevices(r, again) {
    const list = await api('GET', '/api/devices');
    if (r !== route) return;
    list.sort(function (a, b) { return a.name < b.name ? -1 : a.name > b.name ? 1 : 0; });
    let box = view.querySelector('.device-list');
    if (again && box) {
      const seen = {};
      const rows = {};
      box.querySelectorAll('[data-test=device]').forEach(function (row) { rows[row.getAttribute('data-name')] = row; });
      const frag = document.createDocumentFragment();
      list.forEach(function (d) {
        seen[d.name] = true;
        const row = rows[d.name];
        if (row) fillDevice(row, d); else frag.appendChild(deviceRow(d));
      });
      box.querySelectorAll('[data-test=device]').forEach(function (row) {
        if (!seen[row.getAttribute('data-name')]) row.remove();
      });
      box.appendChild(frag);
      deviceIndex = null;
      updateDeviceCount(list);
      return;
    }
    const frag = document.createDocumentFragment();
    list.forEach(function (d) { frag.appendChild(deviceRow(d)); });
    box = el('div', { class: 'device-list' });
    box.appendChild(frag);
    const enrol = el('section', { class: 'enrol' },
      el('button', { type: 'button', 'data-test': 'enrol', onclick: function () { openEnrol(enrol); } }, 'Enrol a device'));
    show(
      el('div', { class: 'heading' }, el('h1', {}, 'Devices'), el('span', { class: 'sub', id: 'device-count' })),
      enrol,
      el('p', { class: 'empty', id: 'no-devices', hidden: list.length ? '' : null }, 'No devices yet. Enrol one to run remote waits on it.'),
      box);
    updateDeviceCount(list);
    every(r, 15000, function () { loadDevices(r, true).catch(function () { /* next time */ }); });
  }
  function updateDeviceCount(list) {
    const c = document.getElementById('device-count');
    if (!c) return;
    const on = list.filter(function (d) { return d.state === 'online'; }).length;
    c.textContent = on + ' online · ' + (list.length - on) + ' offline';
    // The empty-state line goes once a device is listed (an enrolment arrives live).
    const none = document.getElementById('no-devices');
    if (none) none.hidden = list.length > 0;
  }

  function openEnrol(box) {
    const input = el('input', { type: 'text', 'data-test': 'enrol-name', placeholder: 'gpu1', autocomplete: 'off', 'aria-label': 'device name', maxlength: '64' });
    const form = el('form', { class: 'enrol-form', onsubmit: function (e) { e.preventDefault(); enrol(box, input.value.trim()); } },
      el('label', {}, 'Name ', input),
      el('button', { type: 'submit', 'data-test': 'enrol-submit' }, 'Enrol'),
      el('button', { type: 'button', class: 'ghost', onclick: function () { loadDevices(route, false); } }, 'Cancel'));
    box.replaceChildren(form);
    input.focus();
  }
  async function enrol(box, name) {
    if (!name) return;
    let created;
    try {
      created = await api('POST', '/api/devices', { name: name });
    } catch (e) {
      toast(e.message, true);
      return;
    }
    const q = "'" + created.token.replace(/'/g, "'\\''") + "'";
    const lines = [
      '# on ' + created.name + ', with cortex-device-agent and packaging/ copied over (docs/install.md):',
      'echo ' + q + ' | sudo packaging/install-agent.sh --binary ./cortex-device-agent \\',
      '    --hub ' + MESH_URL + ' --name ' + created.name + ' --user "$USER"',
      '',
      '# or by hand, in a terminal:',
      "(umask 077; mkdir -p ~/.cortex && printf '%s\\n' " + q + ' > ~/.cortex/device-token)',
      created.install,
    ].join('\n');
    box.replaceChildren(el('div', { class: 'enrolled' },
      el('p', {}, 'Device ', el('b', {}, created.name), ' enrolled. Its token is shown this once:'),
      el('code', { class: 'token', 'data-test': 'enrol-token' }, created.token),
      el('p', {}, 'On the device:'),
      el('pre', { 'data-test': 'enrol-install' }, lines),
      el('button', { type: 'button', onclick: function () { loadDevices(route, false); } }, 'Done')));
    const row = findDevice(created.name);
    if (!row) {
      const list = view.querySelector('.device-list');
      deviceIndex = null;
      if (list) list.appendChild(deviceRow({ name: created.name, state: 'offline', since: null, last_seen: null, agent_version: null, host: null, spool: { pending: 0, bad: 0 }, waits: 0 }));
    }
  }

  async function loadDevice(r, again) {
    const name = r.arg;
    const both = await Promise.all([
      api('GET', '/api/devices/' + encodeURIComponent(name)),
      api('GET', '/api/devices/' + encodeURIComponent(name) + '/files'),
    ]);
    if (r !== route) return;
    const d = both[0];
    const files = both[1].files || [];
    const detail = el('section', { class: 'device-detail', 'data-test': 'device-detail', 'data-name': d.name, 'data-state': d.state });
    const row = deviceRow(d);
    row.removeAttribute('data-test');
    row.classList.add('summary');
    detail.appendChild(row);
    if (d.state === 'offline') {
      detail.appendChild(el('p', { class: 'offline-banner' }, 'Offline' + (d.offline_reason ? ': ' + d.offline_reason : '') + (d.since ? ' · since ' + clock(d.since) : '')));
    }
    const waits = (d.wait_list || []).map(function (w) {
      return el('li', { class: 'row', 'data-test': 'device-wait', 'data-id': w.id },
        el('span', { class: 'mono' }, w.id), ' ',
        el('span', {}, w.kind === 'pid' ? 'pid ' + w.pid : w.kind + ' ' + (w.path || '')), ' ',
        el('span', { class: 'pill' }, w.state), ' ',
        el('span', { class: 'sub' }, 'bound ' + (w.deadline > Date.now() ? 'in ' + left(w.deadline) : 'passed')));
    });
    const signals = files.filter(function (f) { return f.outcome !== 'refused'; }).map(function (f) {
      return el('li', { class: 'row' },
        el('span', { class: 'sub' }, clock(f.at)), ' ', el('span', { class: 'mono' }, f.name), ' ',
        el('span', { class: 'pill' + (f.outcome === 'retry' ? ' warn' : '') }, f.outcome),
        f.reason ? el('span', { class: 'sub' }, ' ' + f.reason) : null);
    });
    const bad = files.filter(function (f) { return f.outcome === 'refused'; }).map(function (f) {
      return el('li', { class: 'row bad', 'data-test': 'device-bad' },
        el('span', { class: 'sub' }, clock(f.at)), ' ', el('span', { class: 'mono' }, f.name), ': ',
        el('span', {}, f.reason || ''));
    });
    detail.appendChild(el('h2', {}, 'Remote waits'));
    detail.appendChild(waits.length ? el('ul', { class: 'rows' }, waits) : el('p', { class: 'empty' }, 'No active remote waits.'));
    detail.appendChild(el('h2', {}, 'Recent signals'));
    detail.appendChild(el('ul', { class: 'rows', 'data-test': 'device-signals' }, signals.length ? signals : el('li', { class: 'empty' }, 'No spool files from this device since the hub started.')));
    detail.appendChild(el('h2', {}, 'Bad files'));
    detail.appendChild(el('p', { class: 'sub' }, d.spool.bad + ' in the device\'s bad/ now. Refused since the hub started, with the reason each was given:'));
    detail.appendChild(bad.length ? el('ul', { class: 'rows' }, bad) : el('p', { class: 'empty' }, 'None.'));
    detail.appendChild(el('div', { class: 'actions' },
      el('button', { type: 'button', class: 'danger', 'data-test': 'revoke', onclick: function () { revoke(d.name); } }, 'Revoke ' + d.name)));
    show(el('p', {}, el('a', { href: '#/devices' }, '← Devices')), el('h1', {}, d.name), detail);
    if (!again) every(r, 15000, refreshDevices);
  }
  async function revoke(name) {
    if (!(await confirmDialog('Revoke ' + name + '? Its link ends now and its token stops working.', 'Revoke'))) return;
    try {
      await api('DELETE', '/api/devices/' + encodeURIComponent(name));
      toast(name + ' revoked');
      location.hash = '#/devices';
    } catch (e) { toast(e.message, true); }
  }

  // ------------------------------------------------------------------ approvals

  let approvalCache = [];
  async function refreshApprovalCount() {
    try {
      const a = await api('GET', '/api/approvals');
      approvalCache = a.approvals || [];
      const c = document.getElementById('approval-count');
      c.textContent = approvalCache.length ? String(approvalCache.length) : '';
    } catch (e) { /* shown on the next try */ }
  }

  // `GET /api/approvals` lists each request's fields beside its `session`.
  function approvalCard(p, after) {
    const q = p;
    const inputs = [];
    const card = el('div', { class: 'approval ' + q.kind, 'data-test': 'approval', 'data-id': q.id },
      el('div', { class: 'approval-head' },
        el('span', { class: 'amber-dot', 'aria-hidden': 'true' }),
        el('b', {}, q.kind === 'question' ? 'Question' : 'Approval'), ' · ',
        el('span', { class: 'mono' }, q.tool), ' · ',
        el('a', { href: '#/session/' + encodeURIComponent(p.session) }, p.session),
        el('span', { class: 'sub' }, ' asked ' + ago(q.asked_at) + (q.expires_at ? ' · denies itself in ' + left(q.expires_at) : ''))),
      q.reason ? el('p', { class: 'reason' }, q.reason) : null);
    (q.questions || []).forEach(function (qq) {
      const input = el('input', { type: 'text', 'data-test': 'answer-text', 'aria-label': qq.question, placeholder: qq.options && qq.options.length ? qq.options.join(' / ') : 'your answer' });
      inputs.push(input);
      card.appendChild(el('div', { class: 'question' }, el('p', {}, qq.question), qq.options && qq.options.length ? el('p', { class: 'sub' }, 'Options: ' + qq.options.join(', ')) : null, input));
    });
    card.appendChild(el('details', { class: 'args' }, el('summary', {}, 'Arguments'),
      el('pre', { 'data-test': 'approval-args' }, JSON.stringify(q.args, null, 2))));
    if (q.kind !== 'question') card.querySelector('details').open = true;
    async function answer(decision) {
      const body = { request_id: q.id, decision: decision };
      if (q.kind === 'question' && decision === 'allow') {
        body.data = { answers: inputs.map(function (i) { return i.value; }) };
      }
      card.querySelectorAll('button').forEach(function (b) { b.disabled = true; });
      try {
        await api('POST', '/api/sessions/' + encodeURIComponent(p.session) + '/answers', body);
        card.remove();
        toast(decision === 'allow' ? 'Answered' : 'Denied');
        refreshApprovalCount();
        if (after) after();
      } catch (e) {
        card.querySelectorAll('button').forEach(function (b) { b.disabled = false; });
        toast(e.message, true);
      }
    }
    card.appendChild(el('div', { class: 'actions' },
      el('button', { type: 'button', 'data-test': 'approve', onclick: function () { answer('allow'); } }, q.kind === 'question' ? 'Answer' : 'Approve'),
      el('button', { type: 'button', class: 'ghost', 'data-test': 'deny', onclick: function () { answer('deny'); } }, q.kind === 'question' ? 'Decline' : 'Deny')));
    return card;
  }

  async function loadApprovals(r) {
    const a = await api('GET', '/api/approvals');
    if (r !== route) return;
    approvalCache = a.approvals || [];
    const frag = document.createDocumentFragment();
    approvalCache.forEach(function (p) { frag.appendChild(approvalCard(p)); });
    const box = el('div', { class: 'approvals' });
    box.appendChild(frag);
    show(el('h1', {}, 'Waiting on you'),
      approvalCache.length ? null : el('p', { class: 'empty' }, 'Nothing waits on a person.'), box);
    every(r, 5000, async function () {
      const n = await api('GET', '/api/approvals');
      if (r !== route) return;
      const have = {};
      box.querySelectorAll('[data-test=approval]').forEach(function (c) { have[c.getAttribute('data-id')] = c; });
      (n.approvals || []).forEach(function (p) {
        if (have[p.id]) delete have[p.id]; else box.appendChild(approvalCard(p));
      });
      Object.keys(have).forEach(function (k) { have[k].remove(); });
    });
  }

  // ------------------------------------------------------------------ sessions

  // A session's `state` as people read it (GET /api/sessions); a mailbox says so.
  const STATE_WORDS = { running: 'running', idle: 'idle', waiting_on_machine: 'waiting on a machine',
    waiting_on_you: 'waiting on you', failed: 'failed', cancelled: 'cancelled' };
  function stateWords(s) {
    const w = STATE_WORDS[s.state] || s.state || 'idle';
    return s.runs === false ? w + ' (mailbox)' : w;
  }

  function sessionRow(s, waiting) {
    const armed = s.armed_waitpoints > 0;
    return el('a', { class: 'session', 'data-test': 'session', 'data-id': s.id, href: '#/session/' + encodeURIComponent(s.id) },
      el('span', { class: 'marks' },
        armed ? el('span', { class: 'ring', 'data-test': 'ring', title: s.armed_waitpoints + ' armed: waiting on a machine' }) : null,
        waiting ? el('span', { class: 'amber', 'data-test': 'amber', title: 'waiting on you' }) : null),
      el('span', { class: 'title' }, s.title || '(untitled)'),
      el('span', { class: 'mono sub' }, s.id),
      el('span', { class: 'sub' }, el('span', { 'data-test': 'state', 'data-state': s.state || '' }, stateWords(s)),
        ' · ' + (armed ? s.armed_waitpoints + ' armed · ' : '') + 'started ' + ago(s.created_at)));
  }

  async function loadSessions(r) {
    const both = await Promise.all([api('GET', '/api/sessions'), api('GET', '/api/approvals')]);
    if (r !== route) return;
    renderSessions(both[0], both[1].approvals || []);
    every(r, 5000, async function () {
      const b = await Promise.all([api('GET', '/api/sessions'), api('GET', '/api/approvals')]);
      if (r === route) renderSessions(b[0], b[1].approvals || []);
    });
  }
  let sessionsShown = '';
  function renderSessions(list, approvals) {
    // Polled: rebuilt only when something changed, so the list keeps its scroll.
    const sig = JSON.stringify([list, approvals.map(function (p) { return p.session; })]);
    if (sig === sessionsShown && view.querySelector('.session-list')) return;
    sessionsShown = sig;
    const waiting = {};
    approvals.forEach(function (p) { waiting[p.session] = true; });
    list.sort(function (a, b) { return b.created_at - a.created_at || (a.id < b.id ? 1 : a.id > b.id ? -1 : 0); });
    const frag = document.createDocumentFragment();
    list.forEach(function (s) { frag.appendChild(sessionRow(s, !!waiting[s.id])); });
    const box = el('div', { class: 'session-list' });
    box.appendChild(frag);
    show(
      el('div', { class: 'heading' }, el('h1', {}, 'Sessions'),
        el('span', { class: 'legend' }, el('span', { class: 'ring' }), ' waiting on a machine ', el('span', { class: 'amber' }), ' waiting on you')),
      list.length ? null : el('p', { class: 'empty' }, 'No sessions.'), box);
  }

  // ------------------------------------------------------------------ a session

  async function loadSession(r) {
    const sid = r.arg;
    const enc = encodeURIComponent(sid);
    const s = await api('GET', '/api/sessions/' + enc);
    if (r !== route) return;
    const transcript = el('div', { class: 'transcript', 'data-test': 'transcript' });
    const pending = el('div', { class: 'pending-here' });
    const capsuleSlot = el('div', { class: 'capsule-slot' });
    const composer = el('textarea', { 'data-test': 'composer', rows: '3', placeholder: 'Message the session (Ctrl+Enter sends)', 'aria-label': 'message' });
    const send = el('button', { type: 'button', 'data-test': 'send' }, 'Send');
    const st = { sid: sid, transcript: transcript, calls: {}, live: {}, last: 0, waitpoints: [], panelOpen: false, capsuleSlot: capsuleSlot, pending: pending, r: r };
    async function doSend() {
      const text = composer.value;
      if (!text.trim()) return;
      send.disabled = true;
      try {
        await api('POST', '/api/sessions/' + enc + '/messages', { text: text });
        composer.value = '';
      } catch (e) { toast(e.message, true); }
      send.disabled = false;
      composer.focus();
    }
    send.onclick = doSend;
    composer.onkeydown = function (e) { if (e.key === 'Enter' && (e.ctrlKey || e.metaKey)) { e.preventDefault(); doSend(); } };
    show(
      el('p', {}, el('a', { href: '#/sessions' }, '← Sessions')),
      el('div', { class: 'heading' }, el('h1', {}, s.title || '(untitled)'), el('span', { class: 'mono sub' }, s.id)),
      el('div', { class: 'session-page' }, transcript, pending, capsuleSlot,
        el('div', { class: 'composer' }, composer, send)));

    // The stored log, page by page, in one DOM insert each; then the live stream after it.
    let after = 0;
    for (;;) {
      const page = await api('GET', '/api/sessions/' + enc + '/events?after=' + after);
      if (r !== route) return;
      const frag = document.createDocumentFragment();
      page.events.forEach(function (ev) { addEvent(st, ev, frag); after = Math.max(after, ev.seq); });
      transcript.appendChild(frag);
      if (page.events.length < 1000) break;
    }
    st.last = after;
    await Promise.all([loadWaitpoints(st), loadPending(st)]);
    if (r !== route) return;
    transcript.scrollTop = transcript.scrollHeight;
    const es = new EventSource('/api/sessions/' + enc + '/events?after=' + after);
    r.cleanup.push(function () { es.close(); });
    es.addEventListener('event', function (m) {
      let ev;
      try { ev = JSON.parse(m.data); } catch (e) { return; }
      if (ev.seq <= st.last) return;
      st.last = ev.seq;
      const stick = transcript.scrollTop + transcript.clientHeight >= transcript.scrollHeight - 40;
      addEvent(st, ev, transcript);
      if (stick) transcript.scrollTop = transcript.scrollHeight;
      if (/^waitpoint-|^wake$/.test(ev.kind)) soon(st, 'wp', function () { loadWaitpoints(st); });
      if (ev.kind === 'approval-required' || ev.kind === 'answer' || ev.kind === 'run-end' || ev.kind === 'cancel') soon(st, 'ap', function () { loadPending(st); refreshApprovalCount(); });
    });
    es.addEventListener('live', function (m) {
      let ev;
      try { ev = JSON.parse(m.data); } catch (e) { return; }
      if (ev.kind === 'retry') {
        // The attempt's text so far is void: the call is made again.
        ['text', 'reasoning'].forEach(function (ch) {
          const key = ev.run_id + ':' + ev.step + ':' + ch;
          if (st.live[key]) { st.live[key].remove(); delete st.live[key]; }
        });
        return;
      }
      if (ev.kind === 'model-delta') {
        const stick = transcript.scrollTop + transcript.clientHeight >= transcript.scrollHeight - 40;
        liveText(st, ev).textContent += ev.text;
        if (stick) transcript.scrollTop = transcript.scrollHeight;
      }
    });
    every(r, 5000, function () { loadWaitpoints(st); });
    every(r, 30000, function () { renderCapsule(st); });
    const onNarrow = function () { renderCapsule(st); };
    NARROW.addEventListener('change', onNarrow);
    r.cleanup.push(function () { NARROW.removeEventListener('change', onNarrow); closePanel(); });
  }

  function soon(st, key, f) {
    clearTimeout(st['t' + key]);
    st['t' + key] = setTimeout(function () { if (st.r === route) f(); }, 150);
  }

  function liveText(st, ev) {
    const key = ev.run_id + ':' + ev.step + ':' + (ev.channel || 'text');
    let b = st.live[key];
    if (!b) {
      b = el('div', { class: 'msg assistant' + (ev.channel === 'reasoning' ? ' reasoning' : ''), 'data-key': key });
      st.live[key] = b;
      st.transcript.appendChild(b);
    }
    return b;
  }

  function short(v, n) {
    let s = typeof v === 'string' ? v : JSON.stringify(v);
    if (s === undefined) s = '';
    return s.length > n ? s.slice(0, n - 1) + '…' : s;
  }

  function addEvent(st, ev, into) {
    switch (ev.kind) {
      case 'message':
        into.appendChild(el('div', { class: 'msg user' }, ev.text));
        break;
      case 'timer':
        into.appendChild(el('div', { class: 'msg note' }, 'timer ' + ev.name + ': ' + ev.text));
        break;
      case 'wake': {
        const w = ev.waitpoint || {};
        into.appendChild(el('details', { class: 'msg wake ' + ev.reason },
          el('summary', {}, 'woken: ' + (w.label || '') + ' · ' + ev.reason),
          el('pre', {}, ev.text || '')));
        break;
      }
      case 'waitpoint-armed':
        into.appendChild(el('div', { class: 'msg note' }, 'armed ' + ev.waitpoint.label));
        break;
      case 'waitpoint-cancelled':
        into.appendChild(el('div', { class: 'msg note' }, 'cancelled ' + ev.waitpoint.label + ' (by ' + ev.by + ')'));
        break;
      case 'model-delta': {
        const key = ev.run_id + ':' + ev.step + ':' + (ev.channel || 'text');
        const b = st.live[key];
        if (b) { b.textContent = ev.text; delete st.live[key]; }
        else if (ev.text) into.appendChild(el('div', { class: 'msg assistant' + (ev.channel === 'reasoning' ? ' reasoning' : '') }, ev.text));
        break;
      }
      case 'tool-start': {
        const c = ev.call;
        const body = el('pre', { class: 'call-body', hidden: true }, 'arguments:\n' + JSON.stringify(c.args, null, 2));
        const line = el('div', { class: 'tool-call', 'data-test': 'tool-call', 'data-id': c.id },
          el('button', { type: 'button', class: 'call-line', 'aria-expanded': 'false', onclick: function () {
            body.hidden = !body.hidden;
            this.setAttribute('aria-expanded', String(!body.hidden));
            line.classList.toggle('open', !body.hidden);
          } }, el('span', { class: 'mono' }, c.name), el('span', { class: 'sub' }, ' ' + short(c.args, 90)), el('span', { class: 'result-mark' })),
          body);
        st.calls[c.id] = line;
        into.appendChild(line);
        break;
      }
      case 'tool-end': {
        const o = ev.observation;
        const line = st.calls[o.call_id] || (into.querySelector && into.querySelector('[data-test=tool-call][data-id="' + cssEscape(o.call_id) + '"]'));
        if (line) {
          line.classList.add(o.ok ? 'ok' : 'failed');
          line.querySelector('.result-mark').textContent = o.ok ? ' ✓' : ' ✗';
          line.querySelector('.call-body').textContent += '\n\nresult:\n' + (typeof o.result === 'string' ? o.result : JSON.stringify(o.result, null, 2));
        }
        break;
      }
      case 'approval-required':
        into.appendChild(el('div', { class: 'msg note amber-note' }, (ev.approval.kind === 'question' ? 'asks you: ' : 'needs your approval: ') + ev.approval.tool));
        break;
      case 'answer':
        into.appendChild(el('div', { class: 'msg note' }, 'answered ' + (ev.decision || 'allow') + ' (' + ev.by + ')'));
        break;
      case 'retry':
        into.appendChild(el('div', { class: 'msg note' }, 'retrying the model call (' + ev.cause + ')'));
        break;
      case 'cancel':
        into.appendChild(el('div', { class: 'msg note' }, ev.turn_only ? 'turn stopped' : 'session cancelled'));
        break;
      case 'limit-reached':
        into.appendChild(el('div', { class: 'msg note amber-note', 'data-test': 'limit-reached' }, 'limit ' + ev.limit + ': ' + ev.message));
        break;
      case 'run-end':
        if (ev.result && !ev.result.ok && ev.result.error) into.appendChild(el('div', { class: 'msg note bad' }, 'run ended: ' + ev.result.error.message));
        else if (ev.result && ev.result.output && ev.result.output.data !== undefined && ev.result.output.data !== null) into.appendChild(el('pre', { class: 'msg note' }, JSON.stringify(ev.result.output.data, null, 2)));
        break;
      default:
        break;
    }
  }

  async function loadPending(st) {
    const a = await api('GET', '/api/approvals');
    if (st.r !== route) return;
    const frag = document.createDocumentFragment();
    (a.approvals || []).filter(function (p) { return p.session === st.sid; }).forEach(function (p) {
      frag.appendChild(approvalCard(p, function () { loadPending(st); }));
    });
    st.pending.replaceChildren(frag);
  }

  // ------------------------------------------------------------------ waitpoints

  // How far a waitpoint got, as the hub counts it (cortex_protocol::progress, the one
  // rule `cortex wait check` shows too): a barrier's members each once, a monitor's wakes.
  function tally(wp) {
    const p = wp.progress;
    if (!p) return '';
    if (wp.max_signals > 1) return p.wakes + '/' + p.max_signals + ' wakes · ' + p.reports + ' report' + (p.reports === 1 ? '' : 's');
    return p.received + '/' + p.quorum + ' received';
  }
  function undelivered(wp) {
    return wp.wakes.some(function (w) { return !w.delivered; });
  }
  function badges(wp) {
    const b = wp.badges;
    const out = [];
    if (b.wake_limit_reached) out.push({ cls: 'warn', text: 'wake limit reached (' + b.max_wakes_per_hour + '/h) — the next wake waits until the hour clears' });
    if (b.delivery_attempts > 0) out.push({ cls: 'warn', text: 'delivery retrying · ' + b.delivery_attempts + ' attempts' });
    if (!b.wake_limit_reached && b.max_wakes_per_hour > 0 && b.wakes_this_hour >= b.max_wakes_per_hour - 2) out.push({ cls: 'info', text: b.wakes_this_hour + '/' + b.max_wakes_per_hour + ' wakes this hour' });
    const fail = wp.signals.filter(function (s) { return s.status === 'fail'; });
    if (fail.length) out.push({ cls: 'danger', text: 'failure signal' + (fail[fail.length - 1].member ? ' from ' + fail[fail.length - 1].member : '') + (fail[fail.length - 1].message ? ': ' + fail[fail.length - 1].message : '') });
    return out;
  }

  async function loadWaitpoints(st) {
    let list;
    try { list = (await api('GET', '/api/sessions/' + encodeURIComponent(st.sid) + '/waitpoints')).waitpoints; } catch (e) { return; }
    if (st.r !== route) return;
    st.waitpoints = list.filter(function (wp) { return wp.state === 'armed' || undelivered(wp); });
    renderCapsule(st);
    if (st.panelOpen) renderPanel(st);
  }

  function renderCapsule(st) {
    const armed = st.waitpoints.filter(function (wp) { return wp.state === 'armed'; });
    if (!armed.length) {
      if (st.panelOpen) closePanel();
      st.capsuleSlot.replaceChildren();
      return;
    }
    let text;
    if (NARROW.matches) text = String(armed.length);
    else if (armed.length === 1) text = armed[0].label + ' · ' + tally(armed[0]) + ' · expires in ' + left(armed[0].expires_at);
    else text = armed.length + ' waiting items · ' + armed[0].label;
    const dot = st.waitpoints.some(function (wp) { return badges(wp).length > 0; });
    const cap = el('button', { type: 'button', class: 'capsule', 'data-test': 'capsule', 'aria-haspopup': 'dialog', 'aria-expanded': String(st.panelOpen), title: armed.length + ' armed', onclick: function () { if (st.panelOpen) closePanel(); else openPanel(st); } },
      el('span', { class: 'ring small', 'aria-hidden': 'true' }), el('span', { class: 'capsule-text' }, text),
      dot ? el('span', { class: 'capsule-dot', 'data-test': 'capsule-dot', title: 'something needs a look' }) : null);
    const open = st.capsuleSlot.querySelector('[data-test=wp-panel]');
    st.capsuleSlot.replaceChildren(cap);
    if (open) st.capsuleSlot.appendChild(open);
  }

  let panelState = null;
  function openPanel(st) {
    st.panelOpen = true;
    panelState = st;
    renderPanel(st);
    renderCapsule(st);
  }
  function closePanel() {
    const p = document.querySelector('[data-test=wp-panel]');
    if (p) p.remove();
    const shade = document.querySelector('.sheet-shade');
    if (shade) shade.remove();
    if (panelState) { panelState.panelOpen = false; const s = panelState; panelState = null; if (s.r === route) renderCapsule(s); }
  }
  document.addEventListener('keydown', function (e) { if (e.key === 'Escape' && panelState) closePanel(); });

  function renderPanel(st) {
    const narrow = NARROW.matches;
    const old = document.querySelector('[data-test=wp-panel]');
    const scroll = old ? old.scrollTop : 0;
    const panel = el('div', { class: 'wp-panel ' + (narrow ? 'sheet' : 'popover'), 'data-test': 'wp-panel', role: 'dialog', 'aria-label': 'waitpoints' },
      el('div', { class: 'panel-head' }, el('b', {}, st.waitpoints.length + ' waitpoint' + (st.waitpoints.length === 1 ? '' : 's')),
        el('button', { type: 'button', class: 'ghost', onclick: closePanel, 'aria-label': 'close' }, 'Close')));
    const frag = document.createDocumentFragment();
    st.waitpoints.forEach(function (wp) { frag.appendChild(wpCard(st, wp)); });
    panel.appendChild(frag);
    if (old) old.replaceWith(panel);
    else if (narrow) {
      document.body.appendChild(el('div', { class: 'sheet-shade', onclick: closePanel }));
      document.body.appendChild(panel);
    } else st.capsuleSlot.appendChild(panel);
    // A popover opens above the capsule; when the page has no room above it (a short
    // transcript), it opens below instead, never off the top of the page.
    if (!narrow && panel.getBoundingClientRect().top < 0) panel.classList.add('below');
    panel.scrollTop = scroll;
  }

  function wpCard(st, wp) {
    const card = el('div', { class: 'wp', 'data-test': 'wp', 'data-id': wp.id },
      el('div', { class: 'wp-head' }, el('b', {}, wp.label), ' ', el('span', { class: 'pill' }, wp.state),
        el('span', { class: 'sub' }, wp.state === 'armed' ? ' · expires in ' + left(wp.expires_at) : ' · wake being delivered'),
        wp.device ? el('span', { class: 'sub' }, ' · on ' + wp.device) : null),
      el('p', { class: 'intent', 'data-test': 'wp-intent' }, wp.intent),
      el('p', { class: 'quorum', 'data-test': 'wp-quorum' }, tally(wp) + (wp.fail_fast ? ' · fails fast' : '')));
    const bs = badges(wp);
    if (bs.length) card.appendChild(el('div', { class: 'badges' }, bs.map(function (b) { return el('span', { class: 'badge ' + b.cls, 'data-test': 'wp-badge' }, b.text); })));
    if (wp.members.length) {
      const last = {};
      wp.signals.forEach(function (s) { if (s.member) last[s.member] = s; });
      card.appendChild(el('ul', { class: 'members' }, wp.members.map(function (m) {
        const s = last[m];
        return el('li', { 'data-test': 'wp-member', class: s ? s.status : 'waiting' }, el('span', { class: 'mono' }, m), ' ', s ? s.status + (s.message ? ': ' + s.message : '') : 'waiting');
      })));
    }
    const sigs = wp.signals.slice(-50).reverse();
    card.appendChild(el('ul', { class: 'signals' },
      sigs.length ? sigs.map(function (s) {
        return el('li', { 'data-test': 'wp-signal', class: s.status },
          el('span', { class: 'pill ' + s.status }, s.status), ' ',
          s.member ? el('span', { class: 'mono' }, s.member + ' ') : null,
          s.message ? s.message + ' ' : '',
          el('span', { class: 'sub' }, 'via ' + s.source + ' · ' + ago(s.at)));
      }) : el('li', { class: 'empty' }, 'No signal yet.')));
    if (wp.signal_count > sigs.length) card.appendChild(el('p', { class: 'sub' }, (wp.signal_count - sigs.length) + ' older signals not shown'));
    if (wp.state === 'armed') {
      card.appendChild(el('div', { class: 'actions' }, el('button', { type: 'button', class: 'danger', 'data-test': 'wp-cancel', onclick: async function () {
        if (!(await confirmDialog('Cancel the waitpoint "' + wp.label + '"? A later signal to it is answered "already resolved".', 'Cancel it'))) return;
        try {
          await api('DELETE', '/api/waitpoints/' + encodeURIComponent(wp.id));
          toast('Cancelled ' + wp.label);
          loadWaitpoints(st);
        } catch (e) { toast(e.message, true); }
      } }, 'Cancel waitpoint')));
    }
    return card;
  }

  // ------------------------------------------------------------------ start

  document.getElementById('logout').onclick = async function () {
    try {
      await fetch('/logout', { method: 'POST', credentials: 'same-origin', headers: { 'X-CSRF-Token': CSRF } });
    } catch (e) { /* the reload shows where it stands */ }
    location.replace('/');
  };
  window.addEventListener('hashchange', go);
  if (!location.hash || location.hash === '#' || location.hash === '#/') history.replaceState(null, '', '#/devices');
  openHubStream();
  go();
})();
