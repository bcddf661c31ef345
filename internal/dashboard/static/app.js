// packwire dashboard: refreshes the Now page and copies clone URLs. Pages
// work without it (the Now page then reloads itself every 5 s).
"use strict";

function setText(id, text) {
  const el = document.getElementById(id);
  if (el && el.textContent !== text) el.textContent = text;
}

function fillTable(id, rows, cells, emptyText) {
  const table = document.getElementById(id);
  if (!table) return;
  const body = document.createElement("tbody");
  for (const row of rows || []) {
    const tr = document.createElement("tr");
    for (const [key, numeric] of cells) {
      const td = document.createElement("td");
      if (numeric) td.className = "n";
      if (key === "id") {
        const code = document.createElement("code");
        code.textContent = row[key];
        td.appendChild(code);
      } else {
        td.textContent = String(row[key]);
      }
      tr.appendChild(td);
    }
    body.appendChild(tr);
  }
  if (!rows || rows.length === 0) {
    const tr = document.createElement("tr");
    tr.className = "empty";
    const td = document.createElement("td");
    td.colSpan = cells.length;
    td.textContent = emptyText;
    tr.appendChild(td);
    body.appendChild(tr);
  }
  table.replaceChild(body, table.tBodies[0]);
}

function refreshNow(box) {
  fetch(box.dataset.src, { credentials: "same-origin", cache: "no-store" })
    .then((r) => {
      if (r.status === 401) { window.location.assign("/-/login"); return null; }
      return r.ok ? r.json() : null;
    })
    .then((now) => {
      if (!now) return;
      for (const [id, text] of Object.entries(now.fields)) setText(id, text);
      fillTable("active", now.active, [["id"], ["repo"], ["user"], ["kind"], ["transport"], ["bytes_in", true], ["bytes_out", true], ["age", true]], "No git process is running.");
      fillTable("queues", now.queues, [["repo"], ["running", true], ["queued", true]], "No repository holds a slot.");
      fillTable("outcomes", now.outcomes, [["outcome"], ["requests", true], ["share", true]], "No pack was made in the last hour.");
    })
    .catch(() => setText("updated", "connection lost, retrying"));
}

function copyText(button) {
  const text = button.dataset.copy;
  const done = () => { button.textContent = "copied"; setTimeout(() => { button.textContent = "copy"; }, 1500); };
  if (navigator.clipboard && window.isSecureContext) {
    navigator.clipboard.writeText(text).then(done, () => {});
    return;
  }
  // Plain HTTP on another host: select the URL's text and copy the selection.
  const code = button.previousElementSibling;
  const range = document.createRange();
  range.selectNodeContents(code);
  const sel = window.getSelection();
  sel.removeAllRanges();
  sel.addRange(range);
  try { if (document.execCommand("copy")) done(); } catch (e) { /* the text stays selected */ }
}

document.addEventListener("DOMContentLoaded", () => {
  for (const b of document.querySelectorAll("button.copy")) {
    b.hidden = false;
    b.addEventListener("click", () => copyText(b));
  }
  const box = document.getElementById("now");
  if (box) setInterval(() => refreshNow(box), 1500);
});
