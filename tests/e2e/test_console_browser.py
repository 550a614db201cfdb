"""The web console in a real headless browser (Debian's chromium through chromium-driver and
Selenium) against a real cluster started by the launcher of `stockade up`, with mutual TLS.

The browser logs in as the cluster's viewer with a token made as `stockade console` makes it.
It does not trust the cluster CA (`--ignore-certificate-errors`), as a browser that was told
to accept the consoles' certificates. A screenshot of every page is saved under the test's
temporary folder (its path is printed) and copied to ``/tmp/console-screenshots/``; with
``STOCKADE_CONSOLE_DOCS_SCREENSHOTS=<folder>`` (e.g. ``docs/console``) the ones the docs show are
also saved there, as ``<name>.png``.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import ssl
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

import asyncpg
import pytest
from test_drain_on_a_cluster import gates_folder

from ops import rpc
from ops.cluster import LocalCluster
from protocol import pb
from runtime.console_token import make_token
from runtime.tls import TlsFiles

pytestmark = pytest.mark.e2e

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
SHARED_SCREENSHOTS = Path("/tmp/console-screenshots")
DOCS_SCREENSHOTS = "STOCKADE_CONSOLE_DOCS_SCREENSHOTS"
"""Environment variable naming a folder for the screenshots docs/console.md shows."""
PNGQUANT = shutil.which("pngquant")
"""Shrinks the docs' screenshots to a few colours where it is installed (apt-get install pngquant)."""
TAKEOVER_SHOWN_WITHIN_S = 2.0
"""The new leader and epoch must be on the open page this soon after the takeover (its
``acquired_at`` in lease_history, by the database's clock, on this same machine)."""


def _missing_browser() -> str | None:
    for path, package in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if not path.exists():
            return f"{path} is missing: apt-get install -y {package}"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed: pip install -e '.[dev]'"
    return None


@pytest.fixture
def browser() -> Iterator[Any]:
    """A headless chromium driven through chromium-driver; skipped, saying why, without them."""
    missing = _missing_browser()
    if missing:
        pytest.skip(missing)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for argument in (
        "--headless=new",
        "--no-sandbox",  # the tests run as root
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--ignore-certificate-errors",
        "--window-size=1100,720",
    ):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()


class Shot(Protocol):
    def __call__(self, driver: Any, name: str, *, docs_too: bool = False) -> Path: ...


@pytest.fixture
def screenshots(tmp_path: Path) -> Shot:
    """``shot(driver, name)`` saves a PNG under the test's folder and in SHARED_SCREENSHOTS
    (``docs=True``: also in the folder DOCS_SCREENSHOTS names, when it is set)."""
    folder = tmp_path / "screenshots"
    folder.mkdir()
    SHARED_SCREENSHOTS.mkdir(exist_ok=True)
    print(f"console screenshots: {folder} (copied to {SHARED_SCREENSHOTS})")
    docs = os.environ.get(DOCS_SCREENSHOTS)

    def shot(driver: Any, name: str, *, docs_too: bool = False) -> Path:
        path = folder / f"{name}.png"
        driver.save_screenshot(str(path))
        shutil.copy(path, SHARED_SCREENSHOTS / path.name)
        if docs and docs_too:
            Path(docs).mkdir(parents=True, exist_ok=True)
            shutil.copy(path, Path(docs) / path.name)
            if PNGQUANT:
                subprocess.run(
                    [
                        PNGQUANT,
                        "--force",
                        "--ext",
                        ".png",
                        "--strip",
                        "--speed",
                        "1",
                        "32",
                        str(Path(docs) / path.name),
                    ],
                    check=True,
                    timeout=60,
                )
        return path

    return shot


@pytest.fixture
def cluster(tmp_path: Path, database_url: str) -> Iterator[LocalCluster]:
    local = LocalCluster(tmp_path / "stockade", database_url=database_url)
    try:
        yield local
    finally:
        local.down()


def text_of(driver: Any, element_id: str) -> str | None:
    """The text of the element with ``element_id`` now (read in the page: the part it is in is
    replaced at every refresh, so a held element reference would go stale)."""
    return driver.execute_script(
        "const e = document.getElementById(arguments[0]); return e ? e.textContent.trim() : null;", element_id
    )


def attribute_of(driver: Any, selector: str, name: str) -> str | None:
    return driver.execute_script(
        "const e = document.querySelector(arguments[0]); return e ? e.getAttribute(arguments[1]) : null;",
        selector,
        name,
    )


def wait_until(predicate: Callable[[], bool], *, timeout_s: float, what: str, poll_s: float = 0.05) -> float:
    """Poll ``predicate`` until it holds; returns the wall time (Unix seconds) it first did."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(poll_s)
    return time.time()


def page_diagnosis(driver: Any, consoles: dict[str, str], token: str) -> str:
    """What the page shows and logged, and how each console answers its part when asked
    directly (5 s each): for a failure that a loaded machine made once."""
    lines = [
        f"banner: {text_of(driver, 'banner')!r}",
        f"served: {text_of(driver, 'served')!r}",
        *(f"browser log: {entry}" for entry in driver.get_log("browser")),
    ]
    unverified = ssl.create_default_context()
    unverified.check_hostname = False
    unverified.verify_mode = ssl.CERT_NONE
    for cp_id, url in consoles.items():
        started = time.monotonic()
        request = urllib.request.Request(f"{url}/part", headers={"Authorization": f"Bearer {token}"})
        try:
            with urllib.request.urlopen(request, timeout=5.0, context=unverified) as answer:
                outcome = f"HTTP {answer.status}, served by {answer.headers.get('X-Stockade-Served-By')}"
        except urllib.error.HTTPError as exc:
            outcome = f"HTTP {exc.code}"
        except OSError as exc:
            outcome = f"{type(exc).__name__}: {exc}"
        lines.append(f"{cp_id} at {url}: {outcome} after {time.monotonic() - started:.2f} s")
    return "\n".join(lines)


def login_url(console: str, token: str, path: str = "/") -> str:
    return f"{console}{path}#token={token}"


def viewer_token(cluster: LocalCluster, identity: str = "viewer") -> str:
    """A login token for ``identity`` (a certificate of the cluster's folder), as `stockade
    console` makes it."""
    cert_dir = cluster.config().cert_dir
    assert cert_dir is not None, "the cluster runs with TLS"
    return make_token(TlsFiles.in_dir(Path(cert_dir), identity), now_unix_s=time.time(), lifetime_s=3600)


def acquired_unix_s(database_url: str, epoch: int) -> float:
    async def read() -> float:
        connection = await asyncpg.connect(database_url, timeout=10)
        try:
            return float(
                await connection.fetchval(
                    "SELECT extract(epoch FROM acquired_at) FROM lease_history WHERE epoch = $1", epoch
                )
            )
        finally:
            await connection.close()

    return asyncio.run(read())


def test_every_page_shows_the_cluster_and_a_job_reaching_succeeded(
    cluster: LocalCluster, browser: Any, screenshots: Shot
) -> None:
    """Logged in with a viewer's token, the cluster page shows the leader, a submitted job appears
    on the jobs page and reaches succeeded without a reload, its page shows its run and output,
    and an unknown job's page says it was not found."""
    ready = cluster.up(control_planes=3, workers=2)
    consoles = ready.config.console_urls()
    assert len(consoles) == 3
    token = viewer_token(cluster)
    home = consoles["cp-1"]

    browser.get(login_url(home, token))
    wait_until(lambda: text_of(browser, "leader") == ready.status.leader, timeout_s=10, what="the leader")
    assert text_of(browser, "epoch") == str(ready.status.epoch)
    assert "#token" not in browser.current_url  # moved to sessionStorage at once
    screenshots(browser, "cluster", docs_too=True)

    browser.get(f"{home}/jobs")
    wait_until(lambda: text_of(browser, "jobs") is not None, timeout_s=10, what="the jobs page")
    spec = pb.JobSpec(
        name="console <b>e2e</b>",
        cpu_millis=500,
        memory_mb=64,
        command=pb.CommandRuntime(argv=["sh", "-c", "echo hello from the console test; sleep 2"]),
    )
    reply = rpc.call(
        ready.config.control_plane_addresses,
        "submit_job",
        pb.SubmitJobRequest(spec=spec),
        tls=ready.config.client_tls,
    )
    job_id = int(reply.job_id)
    row = f"#jobs tr[data-id='{job_id}']"
    wait_until(
        lambda: attribute_of(browser, row, "data-state") is not None, timeout_s=10, what="the job listed"
    )
    screenshots(browser, "jobs-running")
    wait_until(
        lambda: attribute_of(browser, row, "data-state") == "succeeded",
        timeout_s=60,
        what="the job succeeded",
    )
    assert "console <b>e2e</b>" in (text_of(browser, "jobs") or "")  # markup shown as text
    screenshots(browser, "jobs")

    browser.get(f"{home}/jobs/{job_id}")
    wait_until(lambda: text_of(browser, "job-state") == "succeeded", timeout_s=10, what="the job's page")
    wait_until(
        lambda: "hello from the console test" in (text_of(browser, "output-stdout") or ""),
        timeout_s=10,
        what="the job's output",
    )
    assert "w-" in (text_of(browser, "attempts") or "")
    screenshots(browser, "job")

    for path, element, name in (
        ("/workers", "workers", "workers"),
        ("/workers/w-1", "worker-id", "worker"),
        ("/packing", "packing-chart", "packing"),
    ):
        browser.get(home + path)
        wait_until(lambda element=element: text_of(browser, element) is not None, timeout_s=10, what=path)
        screenshots(browser, name, docs_too=name != "worker")

    browser.get(f"{home}/jobs/999999")
    wait_until(lambda: text_of(browser, "status") == "Not found", timeout_s=10, what="the 404 part")
    assert "no job 999999" in (text_of(browser, "message") or "")
    screenshots(browser, "job-not-found")

    browser.get(f"{home}/jobs?name=%3Cscript%3Ewindow.pwned%3D1%3C%2Fscript%3E")
    wait_until(lambda: text_of(browser, "filter-echo") is not None, timeout_s=10, what="the filtered jobs")
    assert "<script>window.pwned=1</script>" in (text_of(browser, "filter-echo") or "")
    assert browser.execute_script("return window.pwned === undefined")
    screenshots(browser, "jobs-filter-escaped")

    browser.execute_script("sessionStorage.clear()")
    browser.get(f"{home}/")
    wait_until(lambda: text_of(browser, "status") == "Log in to read this console", timeout_s=10, what="401")
    screenshots(browser, "unauthorized")


def test_an_open_page_follows_a_leader_kill_and_moves_when_its_own_replica_dies(
    cluster: LocalCluster, browser: Any, screenshots: Shot, database_url: str
) -> None:
    """A page open on a standby's console shows the new leader and epoch within 2 s of the
    takeover after the leader is SIGKILLed; when the standby it reads is SIGKILLed in turn, the
    page moves to the console of a replica that answers and keeps showing the cluster."""
    ready = cluster.up(control_planes=3, workers=1)
    consoles = ready.config.console_urls()
    old_leader, old_epoch = ready.status.leader, int(ready.status.epoch)
    standbys = [cp_id for cp_id in consoles if cp_id != old_leader]
    reader = standbys[0]
    browser.get(login_url(consoles[reader], viewer_token(cluster)))
    wait_until(lambda: text_of(browser, "leader") == old_leader, timeout_s=10, what="the leader")
    assert attribute_of(browser, "#served", "data-served-by") == reader
    screenshots(browser, "failover-before")

    cluster.kill(old_leader)
    seen_s = wait_until(
        lambda: (
            text_of(browser, "leader") not in (None, old_leader, "none (no live lease)")
            and int(text_of(browser, "epoch") or 0) > old_epoch
        ),
        timeout_s=20,
        what="the new leader on the page",
    )
    new_leader, new_epoch = text_of(browser, "leader"), int(text_of(browser, "epoch") or 0)
    took_s = seen_s - acquired_unix_s(database_url, new_epoch)
    print(f"{new_leader} took over at epoch {new_epoch}; the page showed it {took_s:.2f} s later")
    assert took_s < TAKEOVER_SHOWN_WITHIN_S
    screenshots(browser, "failover-new-leader")

    cluster.kill(reader)
    # Each try of a console that does not answer in time costs the page 3.5 s (console.js),
    # and the last replica may be taking over the lease meanwhile: on a loaded machine its
    # first answers come late.
    try:
        wait_until(
            lambda: attribute_of(browser, "#served", "data-served-by") not in (None, reader),
            timeout_s=60,
            what="the page to move to another console",
        )
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{page_diagnosis(browser, consoles, viewer_token(cluster))}") from None
    (remaining,) = set(consoles) - {old_leader, reader}
    assert attribute_of(browser, "#served", "data-served-by") == remaining
    assert "does not answer" in (text_of(browser, "banner") or "")
    # The reader may have been the new leader: then the last replica takes over in turn.
    expected = new_leader if new_leader != reader else remaining
    wait_until(lambda: text_of(browser, "leader") == expected, timeout_s=30, what="the leader after moving")
    screenshots(browser, "failover-moved")


AT_END_PX = 4
"""An output box scrolled to within this many pixels of its end is at its end (console.js)."""
OVERFLOWING_LINES = 30
"""More lines than the output box shows at once (its max-height is 28em)."""


def output_scroll(driver: Any) -> dict[str, float] | None:
    """The stdout box's scroll: ``top`` and how far its end is below what shows (``below``)."""
    return driver.execute_script(
        "const e = document.getElementById('output-stdout'); if (!e) return null;"
        "return {top: e.scrollTop, below: e.scrollHeight - e.scrollTop - e.clientHeight,"
        " text: e.textContent};"
    )


def test_a_running_jobs_page_is_painted_with_its_content_and_its_output_at_the_newest_line(
    cluster: LocalCluster, browser: Any, screenshots: Shot
) -> None:
    """A running job's page, the moment it has loaded, already shows the job (no placeholder) and
    its output box at its newest line; the box follows new lines while it is at its end and stays
    where the reader scrolled it otherwise; an array's tasks read sh[0]..sh[2] in the jobs list
    and on their pages."""
    ready = cluster.up(control_planes=1, workers=1)
    home = ready.config.console_urls()["cp-1"]
    tls = ready.config.client_tls
    addresses = ready.config.control_plane_addresses
    writes = "i=0; while :; do echo line $i; i=$((i+1)); sleep 0.05; done"
    spec = pb.JobSpec(
        name="follow", cpu_millis=100, memory_mb=64, command=pb.CommandRuntime(argv=["sh", "-c", writes])
    )
    job_id = int(rpc.call(addresses, "submit_job", pb.SubmitJobRequest(spec=spec), tls=tls).job_id)
    array_id = submit(ready, SH_ARRAY)

    browser.get(login_url(home, viewer_token(cluster), f"/jobs/{job_id}"))
    # Read at once, with no waiting: what the page showed when it had loaded.
    assert text_of(browser, "job-id") == str(job_id)
    assert "Loading" not in (text_of(browser, "content") or "")
    screenshots(browser, "job-first-paint")

    wait_until(
        lambda: ((output_scroll(browser) or {}).get("text") or "").count("\n") >= OVERFLOWING_LINES,
        timeout_s=30,
        what="more output than the box shows",
    )
    browser.get(f"{home}/jobs/{job_id}")
    opened = output_scroll(browser)
    assert opened is not None and opened["top"] > 0 and opened["below"] <= AT_END_PX, opened
    screenshots(browser, "job-output-at-newest")

    wait_until(
        lambda: (output_scroll(browser) or {}).get("text") != opened["text"], timeout_s=10, what="new output"
    )
    following = output_scroll(browser)
    assert following is not None and following["below"] <= AT_END_PX, following

    browser.execute_script("document.getElementById('output-stdout').scrollTop = 0")
    before = output_scroll(browser)
    assert before is not None
    wait_until(
        lambda: (output_scroll(browser) or {}).get("text") != before["text"],
        timeout_s=10,
        what="newer output",
    )
    kept = output_scroll(browser)
    assert kept is not None and kept["top"] == 0, kept

    browser.get(f"{home}/jobs?name=sh")
    listed = text_of(browser, "jobs") or ""
    assert all(f"sh[{index}]" in listed for index in range(3)), listed
    browser.get(f"{home}/jobs/{array_id}")
    assert text_of(browser, "job-name") == "sh[0]"
    screenshots(browser, "array-task")


def click(driver: Any, element_id: str) -> None:
    """Click the element with ``element_id`` as it is now (found afresh: parts are replaced)."""
    from selenium.webdriver.common.by import By

    driver.find_element(By.ID, element_id).click()


def shown(driver: Any, element_id: str) -> bool:
    return bool(
        driver.execute_script(
            "const e = document.getElementById(arguments[0]); return !!e && !e.hidden;", element_id
        )
    )


def do_action(driver: Any, button_id: str, *, deadline_s: str | None = None) -> tuple[str, str]:
    """Click an action's button, check its question is asked, confirm, and return (question,
    the result's text) once the result is shown."""
    wait_until(lambda: text_of(driver, button_id) is not None, timeout_s=10, what=f"the {button_id} button")
    driver.execute_script(
        "const r = document.getElementById('action-result'); r.hidden = true; r.innerHTML = '';"
    )
    click(driver, button_id)
    wait_until(lambda: shown(driver, "confirm"), timeout_s=5, what="the confirmation")
    question = text_of(driver, "confirm-question") or ""
    if deadline_s is not None:
        assert shown(driver, "confirm-deadline")
        driver.execute_script(
            "document.getElementById('confirm-deadline-s').value = arguments[0]", deadline_s
        )
    confirmed = time.monotonic()
    click(driver, "confirm-yes")
    wait_until(
        lambda: text_of(driver, "action-message") is not None, timeout_s=20, what="the action's result"
    )
    print(f"{button_id}: its result shown {time.monotonic() - confirmed:.3f} s after confirm was clicked")
    assert not shown(driver, "confirm")
    return question, text_of(driver, "action-message") or ""


def submit(ready: Any, spec: pb.JobSpec) -> int:
    """Submit ``spec`` to the cluster as its operator; returns the job's id."""
    reply = rpc.call(
        ready.config.control_plane_addresses,
        "submit_job",
        pb.SubmitJobRequest(spec=spec),
        tls=ready.config.client_tls,
    )
    return int(reply.job_id)


def command(name: str, script: str) -> pb.JobSpec:
    return pb.JobSpec(
        name=name, cpu_millis=100, memory_mb=64, command=pb.CommandRuntime(argv=["sh", "-c", script])
    )


SH_ARRAY = pb.JobSpec(
    name="sh",
    cpu_millis=100,
    memory_mb=64,
    command=pb.CommandRuntime(argv=["true"]),
    array=pb.JobArray(first_index=0, last_index=2),
)
"""An array of three tasks, sh[0] to sh[2]."""


def test_actions_ask_first_show_their_result_refuse_a_viewer_and_are_audited(
    cluster: LocalCluster, browser: Any, screenshots: Shot, tmp_path: Path
) -> None:
    """In the browser a viewer's cancel is asked, confirmed and refused on the page, and the job
    runs on; an operator who answers "back" changes nothing, and who confirms cancels it (the page
    shows the result, then the job cancelled); the operator cordons, drains with a deadline and
    uncordons a worker, each shown on the worker's page; the audit trail (`stockade audit`'s
    call) lists those four actions as the operator's and none as the viewer's."""
    ready = cluster.up(control_planes=1, workers=2)
    home = ready.config.console_urls()["cp-1"]
    gate = gates_folder(tmp_path) / "never"
    job_id = submit(ready, command("to cancel", f"while [ ! -e {gate} ]; do sleep 0.05; done"))

    browser.get(login_url(home, viewer_token(cluster), f"/jobs/{job_id}"))
    wait_until(lambda: text_of(browser, "job-state") == "running", timeout_s=30, what="the job running")
    question, answer = do_action(browser, "action-cancel")
    assert f"Cancel job {job_id}" in question
    assert answer.startswith("Not done: permission denied"), answer
    assert attribute_of(browser, "#action-message", "data-ok") == "no"
    screenshots(browser, "action-refused-viewer", docs_too=True)
    assert text_of(browser, "job-state") == "running"

    browser.execute_script("sessionStorage.clear()")
    browser.get(login_url(home, viewer_token(cluster, "operator"), f"/jobs/{job_id}"))
    wait_until(lambda: text_of(browser, "action-cancel") is not None, timeout_s=10, what="the cancel button")
    click(browser, "action-cancel")
    wait_until(lambda: shown(browser, "confirm"), timeout_s=5, what="the confirmation")
    screenshots(browser, "action-confirm", docs_too=True)
    click(browser, "confirm-no")
    assert not shown(browser, "confirm") and not shown(browser, "action-result")
    assert text_of(browser, "job-state") == "running"

    _, answer = do_action(browser, "action-cancel")
    assert answer in (f"Done: job {job_id}: cancelling", f"Done: job {job_id}: cancelled"), answer
    screenshots(browser, "action-done")
    try:
        wait_until(
            lambda: (text_of(browser, "job-state") or "").startswith("cancelled"),
            timeout_s=30,
            what="the job cancelled",
        )
    except AssertionError as exc:
        raise AssertionError(f"{exc}: the page shows {text_of(browser, 'job-state')!r}") from None
    assert text_of(browser, "action-cancel") is None
    events = text_of(browser, "events") or ""
    assert "cancel requested" in events and "final" in events

    browser.get(f"{home}/workers/w-1")
    _, answer = do_action(browser, "action-cordon")
    assert answer.startswith("Done: worker w-1: cordoned"), answer
    wait_until(lambda: text_of(browser, "worker-state") == "cordoned", timeout_s=10, what="w-1 cordoned")
    question, answer = do_action(browser, "action-drain", deadline_s="30")
    assert "Drain worker w-1" in question
    assert answer.startswith("Done: worker w-1: cordoned, drained"), answer
    wait_until(lambda: text_of(browser, "worker-state") == "drained", timeout_s=10, what="w-1 drained")
    screenshots(browser, "worker-drained", docs_too=True)
    _, answer = do_action(browser, "action-uncordon")
    assert answer.startswith("Done: worker w-1: takes placements"), answer
    wait_until(lambda: text_of(browser, "worker-state") == "alive", timeout_s=10, what="w-1 alive again")

    reply = rpc.call(
        ready.config.control_plane_addresses,
        "list_audit",
        pb.ListAuditRequest(limit=20),
        tls=ready.config.client_tls,
    )
    made = [(e.role, e.actor_id, e.action) for e in reversed(reply.entries) if e.action != "submit"]
    assert made == [
        ("operator", "operator", "cancel"),
        ("operator", "operator", "cordon"),
        ("operator", "operator", "drain"),
        ("operator", "operator", "uncordon"),
    ]


def test_a_cross_site_form_post_and_a_request_without_the_action_header_are_refused(
    cluster: LocalCluster, browser: Any, tmp_path: Path
) -> None:
    """A form of another origin that posts to the cancel action gets a refusal page, and a
    script of the console's own page that posts without the action header is refused too; the
    job runs on and no cancel is audited."""
    ready = cluster.up(control_planes=1, workers=1)
    home = ready.config.console_urls()["cp-1"]
    gate = gates_folder(tmp_path) / "never"
    job_id = submit(ready, command("not cancelled", f"while [ ! -e {gate} ]; do sleep 0.05; done"))
    action = f"{home}/action/jobs/{job_id}/cancel"

    # A page of another origin (here an opaque one: Origin null) whose form posts to the console.
    form = (
        f'<form id="f" method="post" action="{action}" enctype="text/plain">'
        '<input name=\'{"idempotency_key": "x", "pad": "\' value=\'"}\'></form>'
        "<script>document.getElementById('f').submit()</script>"
    )
    browser.get("data:text/html," + urllib.parse.quote(form))
    wait_until(
        lambda: (
            "cross-site request refused" in (browser.execute_script("return document.body.innerText") or "")
        ),
        timeout_s=10,
        what="the refusal of the cross-site form",
    )

    browser.get(login_url(home, viewer_token(cluster, "operator"), f"/jobs/{job_id}"))
    wait_until(lambda: text_of(browser, "job-state") == "running", timeout_s=30, what="the job running")
    status = browser.execute_async_script(
        """const done = arguments[arguments.length - 1];
        fetch(arguments[0], {method: "POST", headers: {"Content-Type": "application/json",
              "Authorization": "Bearer " + sessionStorage.getItem("stockade-console-token")},
              body: JSON.stringify({idempotency_key: "no-header"})})
          .then((r) => r.text().then((t) => done([r.status, t])));""",
        action,
    )
    assert status[0] == 403 and "no X-Stockade-Action header" in status[1], status
    assert text_of(browser, "job-state") == "running"
    reply = rpc.call(
        ready.config.control_plane_addresses,
        "list_audit",
        pb.ListAuditRequest(action="cancel"),
        tls=ready.config.client_tls,
    )
    assert list(reply.entries) == []


OUTPUT_LINES = 10_000
"""Lines the output test's job writes before its gate: about 98 KB, more than one 64 KiB page."""


def test_the_whole_output_pages_follows_and_downloads_and_the_jobs_page_searches(
    cluster: LocalCluster, browser: Any, screenshots: Shot, tmp_path: Path
) -> None:
    """A job's output page opens at its end and follows what the job writes; "first" shows its
    first line and "next" the page after; the download saves every byte; the job's history shows
    its run; the jobs page finds it by id and by name, and an array's task by name[index]."""
    ready = cluster.up(control_planes=1, workers=1)
    home = ready.config.console_urls()["cp-1"]
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    browser.execute_cdp_cmd(
        "Browser.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(downloads)}
    )
    gate = gates_folder(tmp_path) / "open"
    script = (
        f"i=0; while [ $i -lt {OUTPUT_LINES} ]; do echo line $i; i=$((i+1)); done; "
        f"while [ ! -e {gate} ]; do sleep 0.05; done; echo after the gate"
    )
    job_id = submit(ready, command("pages", script))

    browser.get(login_url(home, viewer_token(cluster), f"/jobs/{job_id}/output?stream=stdout"))
    wait_until(
        lambda: (text_of(browser, "output-stdout") or "").endswith(f"line {OUTPUT_LINES - 1}"),
        timeout_s=30,
        what="the last line written",
    )
    assert not (text_of(browser, "output-stdout") or "").startswith("line 0\n")  # a tail, not all
    gate.touch()
    wait_until(
        lambda: (text_of(browser, "output-stdout") or "").endswith("after the gate"),
        timeout_s=30,
        what="the line written after the gate, followed",
    )
    screenshots(browser, "output-tail", docs_too=True)

    click(browser, "output-first")
    wait_until(
        lambda: (text_of(browser, "output-stdout") or "").startswith("line 0\nline 1\n"),
        timeout_s=10,
        what="the first page",
    )
    assert attribute_of(browser, "#output-range", "data-start") == "0"
    first_end = int(attribute_of(browser, "#output-range", "data-end") or 0)
    assert first_end == 64 * 1024
    click(browser, "output-next")
    wait_until(
        lambda: attribute_of(browser, "#output-range", "data-start") == str(first_end),
        timeout_s=10,
        what="the next page",
    )

    click(browser, "download-stdout")
    saved = downloads / f"job-{job_id}-stdout.txt"
    wait_until(saved.exists, timeout_s=20, what="the download")
    expected = "".join(f"line {i}\n" for i in range(OUTPUT_LINES)) + "after the gate\n"
    wait_until(lambda: saved.read_text() == expected, timeout_s=10, what="every byte downloaded")

    browser.get(f"{home}/jobs/{job_id}")
    wait_until(lambda: text_of(browser, "job-state") == "succeeded", timeout_s=30, what="the job succeeded")
    kinds = browser.execute_script(
        "return Array.from(document.querySelectorAll('#events li')).map((e) => e.dataset.kind)"
    )
    assert kinds[0] == "submitted" and "placed" in kinds and kinds[-1] == "final", kinds
    browser.execute_script("document.getElementById('job-runs').scrollIntoView()")
    screenshots(browser, "job-history", docs_too=True)

    array_id = submit(ready, SH_ARRAY)
    browser.get(f"{home}/jobs")
    wait_until(lambda: text_of(browser, "jobs") is not None, timeout_s=10, what="the jobs page")
    browser.execute_script(
        "document.querySelector('form.filters input[name=id]').value = arguments[0]", str(job_id)
    )
    browser.execute_script("document.querySelector('form.filters').requestSubmit()")
    wait_until(
        lambda: (
            browser.execute_script("return document.querySelectorAll('#jobs tr[data-id]').length") == 1
            and attribute_of(browser, "#jobs tr[data-id]", "data-id") == str(job_id)
        ),
        timeout_s=10,
        what="the job found by id",
    )
    browser.get(f"{home}/jobs?name=sh%5B2%5D")
    wait_until(
        lambda: attribute_of(browser, "#jobs tr[data-id]", "data-id") == str(array_id + 2),
        timeout_s=10,
        what="the array's task found by name[index]",
    )
    assert "sh[2]" in (text_of(browser, "jobs") or "")
    screenshots(browser, "jobs-search", docs_too=True)
