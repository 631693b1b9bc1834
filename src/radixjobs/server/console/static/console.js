// radixjobs console: local times (UTC on hover), relative times, live refresh of [data-live] regions.
// No inline script anywhere (the CSP forbids it); this file is the page's only script.
"use strict";

function relative(date) {
  const delta = (date.getTime() - Date.now()) / 1000;
  const size = Math.abs(delta);
  const text = size < 90 ? `${Math.round(size)} s` : size < 5400 ? `${Math.round(size / 60)} min`
    : size < 172800 ? `${Math.round(size / 3600)} h` : `${Math.round(size / 86400)} d`;
  return delta >= 0 ? `in ${text}` : `${text} ago`;
}

function formatTimes(root) {
  root.querySelectorAll("time.ts").forEach((el) => {
    const date = new Date(el.getAttribute("datetime"));
    if (isNaN(date)) return;
    el.textContent = date.toLocaleString();
    el.title = "UTC " + date.toISOString().replace(".000Z", "Z");
  });
  root.querySelectorAll("time.rel").forEach((el) => {
    const date = new Date(el.getAttribute("datetime"));
    if (isNaN(date)) return;
    el.textContent = relative(date);
    el.title = "UTC " + date.toISOString().replace(".000Z", "Z") + " · " + date.toLocaleString();
  });
  root.querySelectorAll("tspan.tick").forEach((el) => {
    const date = new Date(el.dataset.at);
    if (isNaN(date)) return;
    el.textContent = "day" in el.dataset ? date.toLocaleDateString([], {month: "short", day: "numeric"})
      : date.toLocaleTimeString([], {hour: "2-digit", minute: "2-digit"});
  });
}

let refreshing = false;
async function refresh() {
  const regions = Array.from(document.querySelectorAll("[data-live]"));
  if (refreshing || regions.length === 0 || document.hidden) return;
  if (regions.some((r) => r.querySelector("details[open]"))) return;  // a reader has an error open
  refreshing = true;
  try {
    const response = await fetch(location.href, {credentials: "same-origin", headers: {Accept: "text/html"}});
    if (!response.ok) return;
    const fresh = new DOMParser().parseFromString(await response.text(), "text/html");
    regions.forEach((old) => {
      const next = old.id && fresh.getElementById(old.id);
      if (next) {
        old.replaceWith(next);
        formatTimes(next);
      }
    });
  } catch (err) {
    // the daemon is restarting or gone: keep what is shown
  } finally {
    refreshing = false;
  }
}

document.addEventListener("DOMContentLoaded", () => {
  formatTimes(document);
  setInterval(() => document.querySelectorAll("time.rel").forEach((el) => {
    const date = new Date(el.getAttribute("datetime"));
    if (!isNaN(date)) el.textContent = relative(date);
  }), 1000);
  setInterval(refresh, 3000);
});
