// The Stockade console's one script: puts the page's part in place before the page is first
// painted, keeps it fresh, logs in with the token that `stockade console` put in the URL's
// fragment, and moves to another replica's console when this one stops answering. No build
// step, no library.
//
// It runs where the shell includes it, at the end of the body, holding up the parser: the
// first part is fetched then, synchronously (the one synchronous request), so the first paint
// and the load event already show the page's content, never a placeholder. The shell cannot
// hold the content itself: a navigation carries no Authorization header, and the token is
// never a cookie. Every later refresh is asynchronous.
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
  // An output box scrolled to within this many pixels of its end counts as at its end.
  const AT_END_PX = 4;

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

  function authorization() {
    return login && token() ? "Bearer " + token() : null;
  }

  // An answer is {html, header(name)}, from fetch or from the first, synchronous, request.
  async function ask(origin) {
    const headers = {};
    if (authorization()) headers["Authorization"] = authorization();
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
      return { html: html, header: (name) => response.headers.get(name) };
    } finally {
      clearTimeout(timer);
    }
  }

  function askNow() {
    const request = new XMLHttpRequest();
    request.open("GET", location.origin + partPath(), false);
    if (authorization()) request.setRequestHeader("Authorization", authorization());
    request.send();
    if (request.status === 0) throw new Error("no answer");
    return { html: request.responseText, header: (name) => request.getResponseHeader(name) };
  }

  // Where each output box was scrolled: at its end (then it follows what is added), or where
  // the reader left it.
  function outputScrolls() {
    const kept = {};
    for (const box of content.querySelectorAll("pre.output")) {
      kept[box.id] = {
        top: box.scrollTop,
        atEnd: box.scrollHeight - box.scrollTop - box.clientHeight <= AT_END_PX,
      };
    }
    return kept;
  }

  // A box opens at its newest line and stays there, unless the reader scrolled away from it.
  function restoreOutputScrolls(kept) {
    for (const box of content.querySelectorAll("pre.output")) {
      const was = kept[box.id];
      box.scrollTop = !was || was.atEnd ? box.scrollHeight : was.top;
    }
  }

  let shown = null;
  function show(origin, answer) {
    // Not while the reader types in a filter, and not when nothing changed (keeps the
    // selection and the scroll position).
    const active = document.activeElement;
    const typing = active && content.contains(active) && /^(INPUT|SELECT|TEXTAREA)$/.test(active.tagName);
    if (!typing && answer.html !== shown) {
      const kept = outputScrolls();
      content.innerHTML = answer.html;
      shown = answer.html;
      restoreOutputScrolls(kept);
    }
    const by = answer.header("X-Stockade-Served-By") || "?";
    try {
      const listed = JSON.parse(answer.header("X-Stockade-Consoles") || "[]");
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

  // The first part, before the first paint; a console that does not answer leaves it to the
  // refreshes, which try the others.
  let first = false;
  try {
    show(location.origin, askNow());
    first = true;
  } catch (e) {
    unanswered[location.origin] = true;
  }
  setTimeout(refresh, first ? refreshMs : 0);
})();
