"""Submit a job, wait for it to end, print its output: the Python client in an asyncio program.

Run it where `stockade status` works (it finds the cluster and the certificate the same way):
    python docs/examples/client_asyncio.py
"""

import asyncio
import sys

from ops.client import AsyncioClient, job_spec


async def main() -> None:
    async with AsyncioClient.open() as client:
        spec = job_spec(cpu_millis=250, memory_mb=64, command=["sh", "-c", "echo hello from a job"])
        job_id = await client.submit(spec)
        job = await client.wait(job_id, timeout_s=120)
        print(f"job {job_id} {job.state}, exit code {job.exit_code}", flush=True)
        async for chunk in client.logs(job_id):  # bytes, as the job wrote them
            sys.stdout.buffer.write(chunk.data)


asyncio.run(main())
