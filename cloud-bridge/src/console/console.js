// The fleet console: reads /edges, /tco and /dead-letters from the bridge it is served by and
// draws them, again every 5 s. Every value comes from edges and is written as text
// (textContent, SVG text nodes), never as markup.
"use strict";

const REFRESH_MS = 5000;

function cell(row, text, cls) {
  const td = document.createElement("td");
  td.textContent = text === undefined || text === null ? "–" : String(text);
  if (cls) td.className = cls;
  row.appendChild(td);
  return td;
}

function ago(ms, now) {
  if (!ms) return "never";
  const s = Math.max(0, Math.round((now - ms) / 1000));
  if (s < 120) return s + " s ago";
  if (s < 7200) return Math.round(s / 60) + " min ago";
  return Math.round(s / 3600) + " h ago";
}

function age(ms, now) {
  if (!ms) return "–";
  const s = Math.max(0, Math.round((now - ms) / 1000));
  return s < 120 ? s + " s" : s < 7200 ? Math.round(s / 60) + " min" : Math.round(s / 3600) + " h";
}

function fill(id, rows, make) {
  const body = document.querySelector("#" + id + " tbody");
  body.replaceChildren();
  for (const r of rows) {
    const tr = document.createElement("tr");
    make(tr, r);
    body.appendChild(tr);
  }
}

async function json(path) {
  const res = await fetch(path, { cache: "no-store" });
  if (!res.ok) throw new Error(path + ": " + res.status + " " + (await res.text()));
  return res.json();
}

function drawEdges(view) {
  const now = view.taken_ms;
  document.getElementById("edge-count").textContent = "(" + view.edges.length + ")";
  fill("edges", view.edges, (tr, e) => {
    tr.dataset.edge = e.edge;
    cell(tr, e.edge);
    cell(tr, e.status, e.status);
    cell(tr, e.bridge);
    cell(tr, e.version);
    cell(tr, ago(e.last_seen_ms, now));
    cell(tr, e.backlog, "num");
    cell(tr, age(e.oldest_unacked_ms, now), "num");
    cell(tr, e.dropped, "num");
    cell(tr, e.routes.map((r) => r.class + ": " + (r.route || "–")).join(", "));
  });
  fill("bridges", view.bridges, (tr, b) => {
    cell(tr, b.name);
    cell(tr, b.quic);
    cell(tr, b.stopped ? "stopped" : b.live ? "live" : "silent", b.live ? "connected" : "lost");
    cell(tr, b.edges, "num");
    cell(tr, ago(b.seen_ms, now));
  });
}

function drawTco(fleet) {
  const money = (v) => fleet.currency + " " + Math.round(v).toLocaleString("en");
  document.getElementById("tco-total").textContent =
    "(now " + money(fleet.cost_now) + ", as the models chose " + money(fleet.cost_model) + ")";
  fill("tco", fleet.classes, (tr, c) => {
    tr.dataset.class = c.class;
    cell(tr, c.class);
    cell(tr, c.edges, "num");
    cell(tr, c.msg_per_s.toFixed(1), "num");
    cell(tr, c.gb_month.toFixed(2), "num");
    cell(tr, money(c.cost_now), "num");
    cell(tr, money(c.cost_model), "num");
  });
  // Two bars per class: the cost of the routes the edges have now, and the models' choice.
  const svg = document.getElementById("tco-chart");
  const ns = "http://www.w3.org/2000/svg";
  svg.replaceChildren();
  const max = Math.max(1, ...fleet.classes.map((c) => Math.max(c.cost_now, c.cost_model)));
  const rowH = 34, label = 140, width = 700;
  svg.setAttribute("viewBox", "0 0 " + (label + width + 120) + " " + Math.max(rowH, fleet.classes.length * rowH));
  fleet.classes.forEach((c, i) => {
    const y = i * rowH;
    const t = document.createElementNS(ns, "text");
    t.setAttribute("x", 0);
    t.setAttribute("y", y + 18);
    t.textContent = c.class;
    svg.appendChild(t);
    [["now", c.cost_now, 2], ["model", c.cost_model, 16]].forEach(([cls, v, dy]) => {
      const r = document.createElementNS(ns, "rect");
      r.setAttribute("class", cls);
      r.setAttribute("x", label);
      r.setAttribute("y", y + dy);
      r.setAttribute("height", 12);
      r.setAttribute("width", Math.max(1, (v / max) * width));
      svg.appendChild(r);
      const v2 = document.createElementNS(ns, "text");
      v2.setAttribute("x", label + (v / max) * width + 6);
      v2.setAttribute("y", y + dy + 10);
      v2.textContent = money(v);
      svg.appendChild(v2);
    });
  });
}

function drawDead(dead) {
  document.getElementById("dead-count").textContent = "(" + dead.letters.length + ")";
  document.getElementById("dead-note").textContent = dead.note || "";
  fill("dead", dead.letters, (tr, d) => {
    cell(tr, d.seq, "num");
    cell(tr, d.record.edge);
    cell(tr, d.reason);
    cell(tr, d.record.topic);
    cell(tr, d.record.bytes, "num");
    cell(tr, d.whole ? "whole" : "ids only");
  });
}

async function refresh() {
  const status = document.getElementById("updated");
  const parts = [
    json("/edges").then(drawEdges),
    json("/tco").then(drawTco),
    json("/dead-letters").then(drawDead),
  ];
  const results = await Promise.allSettled(parts);
  const failed = results.filter((r) => r.status === "rejected").map((r) => r.reason.message);
  status.textContent = failed.length
    ? "could not read: " + failed.join("; ")
    : "updated " + new Date().toLocaleTimeString("en-GB");
  status.className = failed.length ? "error" : "";
  document.body.dataset.loaded = failed.length ? "partly" : "yes";
}

refresh();
setInterval(refresh, REFRESH_MS);
