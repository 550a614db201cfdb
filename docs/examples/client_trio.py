"""Submit a job, wait for it to end, print its output: the Python client in a trio program.

Run it where `stockade status` works (it finds the cluster and the certificate the same way):
    python docs/examples/client_trio.py
"""

import sys

import trio

from ops.client import Client, job_spec


async def main() -> None:
    async with Client.open() as client:
        spec = job_spec(cpu_millis=250, memory_mb=64, command=["sh", "-c", "echo hello from a job"])
        job_id = await client.submit(spec)
        job = await client.wait(job_id, timeout_s=120)
        print(f"job {job_id} {job.state}, exit code {job.exit_code}", flush=True)
        async for chunk in client.logs(job_id):  # bytes, as the job wrote them
            sys.stdout.buffer.write(chunk.data)


trio.run(main)
