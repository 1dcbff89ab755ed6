// zlink's page for link owners: everything through the public API (/api/v1), with the owner's
// API key from sessionStorage in the Authorization header. Every string from the API is put
// into the page as text (textContent, attributes of created nodes), never parsed as HTML.
'use strict';

const KEY = 'zlink.api-key';
const SVG = 'http://www.w3.org/2000/svg';
const $ = (id) => document.getElementById(id);

let cursor = null;
let current = null; // the link whose stats are shown: {slug, domain, short_url}
let qrUrl = null;

// An element with attributes and children (strings become text nodes).
function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'class') e.className = v;
    else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v === true ? '' : String(v));
  }
  for (const c of children) e.append(c);
  return e;
}

function svg(tag, attrs, text) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
  if (text !== undefined) e.textContent = String(text);
  return e;
}

class ApiError extends Error {
  constructor(status, code, message) { super(message); this.status = status; this.code = code; }
}

async function api(method, path, body, extra) {
  const headers = { Authorization: 'Bearer ' + sessionStorage.getItem(KEY) };
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  Object.assign(headers, extra || {});
  const r = await fetch(path, {
    method, headers, cache: 'no-store', credentials: 'omit', referrerPolicy: 'no-referrer',
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  if (r.ok && (r.headers.get('content-type') || '').startsWith('image/')) return r.blob();
  const text = await r.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch (_) { data = null; }
  if (!r.ok) {
    const e = data && data.error;
    throw new ApiError(r.status, e ? e.code : 'http_' + r.status, e ? e.message : 'the server answered ' + r.status);
  }
  return data;
}

// The API path of a link: its slug, on its branded domain if any.
function linkPath(l, suffix) {
  const q = l.domain ? '?domain=' + encodeURIComponent(l.domain) : '';
  return '/api/v1/links/' + encodeURIComponent(l.slug) + (suffix || '') + q;
}

function showError(e) {
  $('error').textContent = e ? (e.message || String(e)) : '';
  if (e && e.status === 401) signOut('Your key was refused (revoked or mistyped); sign in again.');
}

function when(iso) {
  if (!iso) return '';
  const d = new Date(iso);
  return isNaN(d) ? iso : d.toLocaleString();
}

// ------------------------------------------------------------------ sign in / out
async function signIn(ev) {
  ev.preventDefault();
  const k = $('key').value.trim();
  $('signin-error').textContent = '';
  if (!k) return;
  sessionStorage.setItem(KEY, k);
  try {
    await api('GET', '/api/v1/links?limit=1');
  } catch (e) {
    sessionStorage.removeItem(KEY);
    $('signin-error').textContent = e.status === 401 ? 'That key is not valid.' : e.message;
    return;
  }
  $('key').value = '';
  start();
}

function signOut(message) {
  sessionStorage.removeItem(KEY);
  $('app').hidden = true;
  $('signout').hidden = true;
  $('who').hidden = true;
  $('signin').hidden = false;
  $('signin-error').textContent = typeof message === 'string' ? message : '';
  $('key').focus();
}

async function start() {
  $('signin').hidden = true;
  $('app').hidden = false;
  $('signout').hidden = false;
  showError(null);
  await Promise.all([loadDomains(), search()]);
  $('c-url').focus();
}

// ------------------------------------------------------------------ create
async function loadDomains() {
  const sel = $('c-domain');
  const chosen = sel.value;
  while (sel.options.length > 1) sel.remove(1);
  const body = $('domains').tBodies[0];
  body.replaceChildren();
  try {
    const d = await api('GET', '/api/v1/domains');
    const domains = d.domains || [];
    for (const dom of domains) {
      if (dom.status === 'ACTIVE') sel.append(el('option', { value: dom.domain }, dom.domain));
      body.append(el('tr', { 'data-domain': dom.domain },
        el('td', {}, dom.domain),
        el('td', { class: 'status' }, dom.status === 'PENDING' ? 'PENDING (waits for approval)' : dom.status),
        el('td', {}, when(dom.created_at))));
    }
    $('domains-empty').hidden = domains.length > 0;
    sel.value = [...sel.options].some((o) => o.value === chosen) ? chosen : '';
  } catch (e) { showError(e); }
}

async function registerDomain(ev) {
  ev.preventDefault();
  const out = $('domain-result');
  out.textContent = '';
  out.className = '';
  try {
    const d = await api('POST', '/api/v1/domains', { domain: $('d-name').value.trim() });
    out.textContent = d.status === 'ACTIVE' ? `${d.domain} is active` : `${d.domain} is registered and waits for approval`;
    $('d-name').value = '';
    await loadDomains();
  } catch (e) {
    out.className = 'error';
    out.textContent = e.message;
  }
}

async function create(ev) {
  ev.preventDefault();
  const out = $('create-result');
  out.textContent = '';
  const body = { url: $('c-url').value.trim() };
  const slug = $('c-slug').value.trim();
  const domain = $('c-domain').value;
  const expires = $('c-expires').value;
  const alias = $('c-alias').value.trim();
  if (slug) body.slug = slug;
  if (domain) body.domain = domain;
  if (alias) body.alias = alias;
  if (expires) {
    const t = new Date(expires);
    if (isNaN(t)) { out.textContent = 'The expiry is not a date.'; return; }
    body.expires_at = t.toISOString();
  }
  const button = ev.submitter || $('create-form').querySelector('button');
  button.disabled = true;
  try {
    // One key per submission: a retry after a lost answer cannot create the link twice.
    const l = await api('POST', '/api/v1/links', body, { 'Idempotency-Key': requestId() });
    out.replaceChildren('Created ', el('a', { href: l.short_url, id: 'created-link' }, l.short_url));
    $('create-form').reset();
    await search();
  } catch (e) {
    out.textContent = 'Not created: ' + e.message;
  } finally {
    button.disabled = false;
  }
}

// 128 random bits as hex (crypto.randomUUID exists only on HTTPS pages; this works on both).
function requestId() {
  const b = crypto.getRandomValues(new Uint8Array(16));
  return 'web-' + Array.from(b, (x) => x.toString(16).padStart(2, '0')).join('');
}

// ------------------------------------------------------------------ list
async function search(ev) {
  if (ev) ev.preventDefault();
  cursor = null;
  $('links').tBodies[0].replaceChildren();
  await loadPage();
}

async function loadPage() {
  const p = new URLSearchParams({ limit: '20' });
  const q = $('q').value.trim();
  const st = $('status').value;
  if (q) p.set('q', q);
  if (st) p.set('status', st);
  if (cursor) p.set('cursor', cursor);
  try {
    const page = await api('GET', '/api/v1/links?' + p);
    const body = $('links').tBodies[0];
    for (const l of page.links) body.append(row(l));
    cursor = page.next_cursor || null;
    $('more').hidden = !cursor;
    $('links-empty').hidden = body.rows.length > 0;
  } catch (e) { showError(e); }
}

function row(l) {
  const dest = safeHref(l.url)
    ? el('a', { href: l.url, rel: 'noopener noreferrer nofollow', target: '_blank' }, l.url)
    : l.url;
  const actions = el('td', { class: 'actions' });
  actions.append(el('button', { type: 'button', class: 'secondary', onclick: () => openDetail(l) }, 'Clicks & QR'));
  if (l.status === 'ACTIVE' || l.status === 'DISABLED') {
    const enable = l.status === 'DISABLED';
    actions.append(el('button', {
      type: 'button', class: 'secondary', disabled: l.disabled_by === 'admin',
      title: l.disabled_by === 'admin' ? 'Taken down by an admin' : undefined,
      onclick: () => act(() => api('PATCH', linkPath(l), { status: enable ? 'ACTIVE' : 'DISABLED' })),
    }, enable ? 'Enable' : 'Disable'));
  }
  if (l.status !== 'DELETED') {
    // Two steps instead of a dialog: the first press arms, the second deletes.
    const del = el('button', { type: 'button', class: 'danger' }, 'Delete');
    del.addEventListener('click', () => {
      if (del.dataset.armed) return act(() => api('DELETE', linkPath(l)));
      del.dataset.armed = '1';
      del.textContent = 'Really delete?';
      setTimeout(() => { delete del.dataset.armed; del.textContent = 'Delete'; }, 5000);
    });
    actions.append(del);
  }
  const name = l.alias ? el('div', { class: 'hint' }, l.alias) : '';
  return el('tr', { 'data-slug': l.slug, 'data-domain': l.domain || '' },
    el('td', {}, el('a', { href: l.short_url }, l.short_url), name),
    el('td', { class: 'dest' }, dest),
    el('td', { class: 'status' }, l.status + (l.disabled_by === 'admin' ? ' (taken down)' : '')),
    el('td', {}, when(l.created_at)),
    actions);
}

function safeHref(u) {
  try { return ['http:', 'https:'].includes(new URL(u).protocol); } catch (_) { return false; }
}

async function act(f) {
  try { await f(); showError(null); await search(); } catch (e) { showError(e); }
}

// ------------------------------------------------------------------ stats and QR
async function openDetail(l) {
  clearQr();
  current = l;
  $('detail').hidden = false;
  $('detail-h').textContent = l.short_url;
  $('detail-dest').textContent = '→ ' + l.url;
  await Promise.all([loadStats(), loadQr()]);
  $('detail').focus();
}

function closeDetail() {
  current = null;
  $('detail').hidden = true;
  clearQr();
}

// No QR code shown: the one of the link open before must never stand for the next one.
function clearQr() {
  if (qrUrl) { URL.revokeObjectURL(qrUrl); qrUrl = null; }
  $('qr-img').hidden = true;
  $('qr-img').removeAttribute('src');
  $('qr-download').hidden = true;
}

async function loadStats() {
  if (!current) return;
  try {
    const s = await api('GET', linkPath(current, '/stats'));
    $('totals').textContent = `${s.total} ${s.total === 1 ? 'click' : 'clicks'}: ${s.humans} by people, ${s.bots} by bots and link previews`;
    $('totals').dataset.total = String(s.total);
    dayChart($('chart-days'), s.last_days);
    barChart($('chart-countries'), s.top_countries.map((c) => [c.country, c.clicks]));
    barChart($('chart-referrers'), s.top_referrers.map((r) => [r.referrer, r.clicks]));
    barChart($('chart-devices'), Object.entries(s.by_device));
  } catch (e) { showError(e); }
}

// The link's QR code. A server error (a store that did not answer in time) is tried again,
// twice, after 0.5 s and 1 s; the refresh button fetches a code that is still missing.
async function loadQr() {
  const link = current;
  if (!link) return;
  for (let attempt = 1; ; attempt++) {
    try {
      const blob = await api('GET', linkPath(link, '/qr') + (link.domain ? '&' : '?') + 'format=png&size=384');
      if (current !== link) return;
      if (qrUrl) URL.revokeObjectURL(qrUrl);
      qrUrl = URL.createObjectURL(blob);
      $('qr-img').src = qrUrl;
      $('qr-img').hidden = false;
      const a = $('qr-download');
      a.href = qrUrl;
      a.download = (link.domain ? link.domain + '-' : '') + link.slug + '.png';
      a.hidden = false;
      return;
    } catch (e) {
      const transient = !(e instanceof ApiError) || e.status >= 500;
      if (!transient || attempt >= 3 || current !== link) { showError(e); return; }
      await new Promise((r) => setTimeout(r, 500 * attempt));
    }
  }
}

function refreshDetail() {
  loadStats();
  if (!qrUrl) loadQr();
}

// Replaces a figure's chart, keeping its caption.
function setChart(fig, node) {
  for (const c of [...fig.children]) if (c.tagName.toLowerCase() !== 'figcaption') c.remove();
  fig.append(node);
}

// Clicks per day: one bar a day, the busiest day's count on the axis.
function dayChart(fig, days) {
  const W = 600, H = 180, pad = 28, max = Math.max(1, ...days.map((d) => d.clicks));
  const bw = (W - pad) / Math.max(1, days.length);
  const total = days.reduce((a, d) => a + d.clicks, 0);
  const s = svg('svg', { viewBox: `0 0 ${W} ${H + 20}`, role: 'img', 'aria-label': `${total} clicks in the last ${days.length} days, at most ${max} a day` });
  s.append(svg('line', { x1: pad, y1: H, x2: W, y2: H }));
  s.append(svg('text', { x: 0, y: 12 }, max));
  days.forEach((d, i) => {
    const h = Math.round((d.clicks / max) * (H - 20));
    const r = svg('rect', { class: 'bar', x: pad + i * bw + 1, y: H - h, width: Math.max(1, bw - 2), height: h, 'data-date': d.date, 'data-clicks': d.clicks });
    r.append(svg('title', {}, `${d.date}: ${d.clicks}`));
    s.append(r);
  });
  if (days.length) {
    s.append(svg('text', { x: pad, y: H + 16 }, days[0].date));
    s.append(svg('text', { x: W, y: H + 16, 'text-anchor': 'end' }, days[days.length - 1].date));
  }
  setChart(fig, s);
}

// Horizontal bars with their labels and counts (a name from the API is only ever text).
function barChart(fig, rows) {
  if (!rows.length) { setChart(fig, el('p', { class: 'hint' }, 'No clicks yet.')); return; }
  const W = 400, rh = 22, lw = 130, max = Math.max(1, ...rows.map((r) => r[1]));
  const s = svg('svg', { viewBox: `0 0 ${W} ${rows.length * rh}`, role: 'img', 'aria-label': rows.map((r) => `${r[0]}: ${r[1]}`).join(', ') });
  rows.forEach(([name, n], i) => {
    const y = i * rh;
    const label = String(name).length > 20 ? String(name).slice(0, 19) + '…' : String(name);
    s.append(svg('text', { x: 0, y: y + 15 }, label));
    s.append(svg('rect', { class: 'bar', x: lw, y: y + 3, width: Math.max(n ? 2 : 0, ((W - lw - 50) * n) / max), height: rh - 6, 'data-name': name, 'data-clicks': n }));
    s.append(svg('text', { x: W, y: y + 15, 'text-anchor': 'end' }, n));
  });
  setChart(fig, s);
}

// ------------------------------------------------------------------ wiring
document.addEventListener('DOMContentLoaded', () => {
  $('signin-form').addEventListener('submit', signIn);
  $('signout').addEventListener('click', () => signOut());
  $('create-form').addEventListener('submit', create);
  $('domain-form').addEventListener('submit', registerDomain);
  $('search-form').addEventListener('submit', search);
  $('more').addEventListener('click', loadPage);
  $('refresh').addEventListener('click', refreshDetail);
  $('close').addEventListener('click', closeDetail);
  if (sessionStorage.getItem(KEY)) start(); else $('key').focus();
});
