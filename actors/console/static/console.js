// The Stockade console's one script: keeps the page's part fresh, logs in with the token that
// `stockade console` put in the URL's fragment, and moves to another replica's console when
// this one stops answering. No build step, no library.
(function () {
  "use strict";
  const body = document.body;
  const refreshMs = Number(body.dataset.refreshMs) || 1000;
  const login = body.dataset.login === "token";
  const content = document.getElementById("content");
  const served = document.getElementById("served");
  const banner = document.getElementById("banner");
  const TOKEN_KEY = "stockade-console-token";
  // An answer later than this counts as none: the console bounds its reads at about 2 s.
  const ANSWER_TIMEOUT_MS = 3500;

  // The token travels in the fragment (never sent to a server); keep it for this tab only
  // and take it out of the address bar.
  const fragment = new URLSearchParams(location.hash.slice(1));
  if (fragment.has("token")) {
    sessionStorage.setItem(TOKEN_KEY, fragment.get("token"));
    history.replaceState(null, "", location.pathname + location.search);
  }
  const token = () => sessionStorage.getItem(TOKEN_KEY);

  let consoles = [{ id: body.dataset.home, url: location.origin }];
  let current = location.origin;
  let unanswered = {};

  function partPath() {
    return "/part" + (location.pathname === "/" ? "" : location.pathname) + location.search;
  }

  function candidates() {
    const urls = consoles.map((c) => c.url);
    if (!urls.includes(current)) urls.unshift(current);
    const start = urls.indexOf(current);
    return urls.slice(start).concat(urls.slice(0, start));
  }

  async function ask(origin) {
    const headers = {};
    if (login && token()) headers["Authorization"] = "Bearer " + token();
    const controller = new AbortController();
    const timer = setTimeout(() => controller.abort(), ANSWER_TIMEOUT_MS);
    try {
      const response = await fetch(origin + partPath(), {
        headers: headers,
        cache: "no-store",
        credentials: "omit",
        mode: origin === location.origin ? "same-origin" : "cors",
        signal: controller.signal,
      });
      const html = await response.text();
      return { response: response, html: html };
    } finally {
      clearTimeout(timer);
    }
  }

  let shown = null;
  function show(origin, answer) {
    // Not while the reader types in a filter, and not when nothing changed (keeps the
    // selection and the scroll position).
    const active = document.activeElement;
    const typing = active && content.contains(active) && /^(INPUT|SELECT|TEXTAREA)$/.test(active.tagName);
    if (!typing && answer.html !== shown) {
      content.innerHTML = answer.html;
      shown = answer.html;
    }
    const by = answer.response.headers.get("X-Stockade-Served-By") || "?";
    try {
      const listed = JSON.parse(answer.response.headers.get("X-Stockade-Consoles") || "[]");
      if (Array.isArray(listed) && listed.length) consoles = listed;
    } catch (e) { /* keep the list we had */ }
    served.textContent = "served by " + by + (origin === location.origin ? "" : " (" + origin + ")");
    served.dataset.servedBy = by;
    const missing = Object.keys(unanswered);
    if (origin !== location.origin || missing.length) {
      banner.hidden = false;
      banner.textContent = "The console at " + (missing.join(", ") || location.origin) +
        " does not answer: this page now reads " + by + "'s console at " + origin + ".";
    } else {
      banner.hidden = true;
    }
    document.title = "Stockade: " + (content.querySelector("h1") || { textContent: "console" }).textContent;
  }

  async function refresh() {
    const started = Date.now();
    for (const origin of candidates()) {
      try {
        const answer = await ask(origin);
        delete unanswered[origin];
        if (origin !== current) current = origin;
        show(origin, answer);
        break;
      } catch (e) {
        unanswered[origin] = true;
      }
    }
    if (Object.keys(unanswered).length >= candidates().length) {
      banner.hidden = false;
      banner.textContent = "No console of this cluster answers (tried " + candidates().join(", ") +
        "); the page keeps trying.";
    }
    setTimeout(refresh, Math.max(0, refreshMs - (Date.now() - started)));
  }

  // Links and filters lead to the console that answers, with the token, when it is not this one.
  function elsewhere(path) {
    const target = current + path;
    location.href = login && token() ? target + "#token=" + encodeURIComponent(token()) : target;
  }
  document.addEventListener("click", (event) => {
    const link = event.target.closest && event.target.closest("a[href^='/']");
    if (link && current !== location.origin && !event.ctrlKey && !event.metaKey) {
      event.preventDefault();
      elsewhere(link.getAttribute("href"));
    }
  });
  document.addEventListener("submit", (event) => {
    const form = event.target;
    if (current !== location.origin && form.method.toLowerCase() === "get") {
      event.preventDefault();
      elsewhere(form.getAttribute("action") + "?" + new URLSearchParams(new FormData(form)).toString());
    }
  });

  refresh();
})();
