"""What a job actually uses, end to end: a local cluster of real processes (the launcher of
`stockade up`), a command job spinning on two cores, its figures read where an operator reads
them: its console page (over HTTPS, as the cluster's viewer) and `stockade job --json`.

The workers find their mode themselves (``--job-resources auto``); where the machine gives
them no cgroups (their label ``resources=rlimit``) nothing is measured and the test skips,
saying so.
"""

from __future__ import annotations

import json
import os
import re
import ssl
import time
import urllib.request
from pathlib import Path

import pytest
from test_cluster import Launch, fetch, launch, wait_for  # noqa: F401 (launch: a fixture)
from test_job_resources_on_a_cluster import cgroups_mode, stockade

from runtime.console_token import make_token
from runtime.tls import TlsFiles

pytestmark = pytest.mark.e2e

MARK = "stockade-usage-e2e"
"""Found in the job's command line: the test finds its processes by it."""
SPIN_TWO_CORES = f"# {MARK}\nimport os\nos.fork()\nwhile True:\n    pass\n"
"""Two processes (a fork), each spinning on a core until killed."""


def job_cpu_s() -> float:
    """The CPU time the job's processes have used so far (utime + stime in /proc), in seconds:
    the kernel's count per process, apart from the cgroup, the agent and the cluster."""
    ticks = 0
    for entry in Path("/proc").iterdir():
        try:
            if not entry.name.isdigit() or MARK.encode() not in (entry / "cmdline").read_bytes():
                continue
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        ticks += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
    return ticks / os.sysconf("SC_CLK_TCK")


def job_part(console_url: str, token: str, job_id: str) -> str:
    """The HTML of the job's part of the console, asked as a page's script asks it."""
    unverified = ssl.create_default_context()
    unverified.check_hostname = False
    unverified.verify_mode = ssl.CERT_NONE  # the test does not load the cluster CA into urllib
    request = urllib.request.Request(
        f"{console_url}/part/jobs/{job_id}", headers={"Authorization": f"Bearer {token}"}
    )
    with urllib.request.urlopen(request, timeout=10.0, context=unverified) as answer:
        return str(answer.read().decode())


def test_a_job_spinning_on_two_cores_reads_what_it_uses_on_its_page(
    launch: Launch,  # noqa: F811 (the fixture imported above)
    database_url: str,
) -> None:
    """A job of cpu_millis 2000 spinning two processes: its samples (every usage_interval_s, 5 s)
    agree with the CPU time the kernel counted for its processes over the same 15 s; its console
    page and `stockade job --json` show the newest, 1.8 to 2.0 cores when the job had two cores
    (on a loaded machine it has less, and reads what it had); its memory is within its 64 MiB."""
    _, ready = launch(1, 1)
    config = ready.config
    cgroups_mode(config)  # nothing is measured without cgroups: skips, saying so

    submitted = stockade(
        config, "submit", "--cpu-millis", "2000", "--memory-mb", "64", "--", "python3", "-c", SPIN_TWO_CORES
    )
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip()
    assert config.cert_dir is not None, "the cluster runs with TLS"
    token = make_token(
        TlsFiles.in_dir(Path(config.cert_dir), "viewer"), now_unix_s=time.time(), lifetime_s=3600
    )
    console_url = config.console_urls()["cp-1"]
    page = ""

    def samples_shown(count: int) -> bool:
        nonlocal page
        page = job_part(console_url, token, job_id)
        found = re.search(r"\((\d+) samples? over the last", page)
        return found is not None and int(found.group(1)) >= count

    def samples_within(begin_unix_s: float, end_unix_s: float) -> list[int]:
        """The job's samples whose span lies within the window (their span ends as recorded)."""
        rows = fetch(
            database_url,
            "SELECT cpu_millis FROM usage_samples WHERE job_id = $1"
            " AND at - make_interval(secs => span_ms / 1000.0) >= to_timestamp($2)"
            " AND at <= to_timestamp($3) ORDER BY at",
            int(job_id),
            begin_unix_s,
            end_unix_s,
        )
        return [int(r["cpu_millis"]) for r in rows]

    try:
        wait_for(
            lambda: samples_shown(2), timeout_s=60, what=f"two usage samples of job {job_id} on its page"
        )
        began, cpu_began = time.time(), job_cpu_s()
        time.sleep(15.5)
        ended, cpu_ended = time.time(), job_cpu_s()
        kernel_cores = (cpu_ended - cpu_began) / (ended - began)
        sampled = samples_within(began, ended)
        wait_for(lambda: samples_shown(5), timeout_s=30, what=f"five usage samples of job {job_id}")
        cpu = re.search(r'id="usage-cpu" data-cpu-millis="(\d+)">([0-9.]+) cores', page)
        memory = re.search(r'id="usage-memory" data-memory-mb="(\d+)"', page)
        assert cpu is not None and memory is not None, page
        shown = json.loads(stockade(config, "job", job_id, "--json").stdout)["status"]
        print(
            f"job {job_id}: the kernel counted {kernel_cores:.3f} cores over {ended - began:.1f} s; samples "
            f"within it {sampled} millicores; its page reads {cpu.group(2)} cores, {memory.group(1)} MiB; "
            f"stockade job --json: {shown['usage']}"
        )
        assert len(sampled) >= 2, sampled
        assert abs(sum(sampled) / len(sampled) / 1000 - kernel_cores) <= 0.15, (sampled, kernel_cores)
        assert 0 < int(cpu.group(1)) <= 2000 and 0 < int(memory.group(1)) <= 64
        assert kernel_cores < 1.8 or int(cpu.group(1)) >= 1800, f"two cores used, {cpu.group(2)} shown"
        assert shown["state"] == "running" and shown["usage"] is not None
        assert 0 < shown["usage"]["cpu_millis"] <= 2000, shown["usage"]
    finally:
        stockade(config, "cancel", job_id)
