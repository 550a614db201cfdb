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
  // Also when a new login URL is opened over this same page (only its fragment differs).
  function takeToken() {
    const fragment = new URLSearchParams(location.hash.slice(1));
    if (fragment.has("token")) {
      sessionStorage.setItem(TOKEN_KEY, fragment.get("token"));
      history.replaceState(null, "", location.pathname + location.search);
    }
  }
  takeToken();
  window.addEventListener("hashchange", takeToken);
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

  // A box opens at its newest line and stays there, unless the reader scrolled away from it;
  // a page of output read at an offset opens at its first line.
  function restoreOutputScrolls(kept) {
    for (const box of content.querySelectorAll("pre.output")) {
      const was = kept[box.id];
      const opensAtTop = !was && box.dataset.opens === "top";
      box.scrollTop = opensAtTop ? 0 : !was || was.atEnd ? box.scrollHeight : was.top;
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

  let timer = null;
  function refreshSoon() {
    clearTimeout(timer);
    timer = setTimeout(refresh, 0);
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
    clearTimeout(timer);
    timer = setTimeout(refresh, Math.max(0, refreshMs - (Date.now() - started)));
  }

  // Actions: a button asks its question in the confirmation box (outside the refreshed
  // content); "confirm" posts the action with the token and the action header (a form of
  // another site can send neither), and the answer's part is shown until closed.
  const confirmBox = document.getElementById("confirm");
  const question = document.getElementById("confirm-question");
  const deadlineLabel = document.getElementById("confirm-deadline");
  const deadlineInput = document.getElementById("confirm-deadline-s");
  const result = document.getElementById("action-result");
  let asked = null;

  function newKey() {
    const bytes = new Uint8Array(16);
    crypto.getRandomValues(bytes);
    return "console-" + Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
  }

  function askConfirmation(button) {
    asked = { url: button.dataset.actionUrl, drain: button.dataset.drain === "1", key: newKey() };
    question.textContent = button.dataset.question;
    deadlineLabel.hidden = !asked.drain;
    deadlineInput.value = "";
    result.hidden = true;
    confirmBox.hidden = false;
    document.getElementById("confirm-yes").focus();
  }

  async function act() {
    const action = asked;
    confirmBox.hidden = true;
    asked = null;
    const body = { idempotency_key: action.key };
    if (action.drain) body.deadline_s = deadlineInput.value === "" ? null : Number(deadlineInput.value);
    const headers = { "Content-Type": "application/json", "X-Stockade-Action": "1" };
    if (authorization()) headers["Authorization"] = authorization();
    let html;
    try {
      const response = await fetch(current + action.url, {
        method: "POST",
        headers: headers,
        body: JSON.stringify(body),
        cache: "no-store",
        credentials: "omit",
        mode: current === location.origin ? "same-origin" : "cors",
      });
      html = await response.text();
    } catch (e) {
      html = '<p class="action-refused" id="action-message" data-ok="no"></p>';
      result.innerHTML = html;
      document.getElementById("action-message").textContent =
        "Not known whether it was done: no answer from " + current + " (" + e + "); look again before retrying.";
      result.hidden = false;
      return;
    }
    result.innerHTML = html;
    result.hidden = false;
    refreshSoon();
  }

  // A download carries the token too: fetched, then handed to the browser as a file.
  async function download(link) {
    const headers = {};
    if (authorization()) headers["Authorization"] = authorization();
    const response = await fetch(current + link.getAttribute("href"), {
      headers: headers,
      cache: "no-store",
      credentials: "omit",
      mode: current === location.origin ? "same-origin" : "cors",
    });
    if (!response.ok) {
      result.innerHTML = '<p class="action-refused" id="action-message" data-ok="no"></p>';
      document.getElementById("action-message").textContent = "Download failed: " + (await response.text());
      result.hidden = false;
      return;
    }
    const url = URL.createObjectURL(await response.blob());
    const save = document.createElement("a");
    save.href = url;
    save.download = link.dataset.filename || "output.txt";
    document.body.appendChild(save);
    save.click();
    save.remove();
    setTimeout(() => URL.revokeObjectURL(url), 60000);
  }

  document.addEventListener("click", (event) => {
    const target = event.target;
    if (!target.closest) return;
    const button = target.closest("button.action");
    if (button) {
      askConfirmation(button);
    } else if (target.id === "confirm-yes" && asked) {
      act();
    } else if (target.id === "confirm-no") {
      confirmBox.hidden = true;
      asked = null;
    } else if (target.id === "action-close") {
      result.hidden = true;
    } else if (target.closest("a.download")) {
      event.preventDefault();
      event.stopImmediatePropagation();
      download(target.closest("a.download"));
    }
  }, true);

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
  timer = setTimeout(refresh, first ? refreshMs : 0);
})();
