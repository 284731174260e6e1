"""The floor under bench/api_load.py: an empty FastAPI route on the same server stack (uvicorn, uvloop, httptools).

No auth, no store, no middleware: what one interpreter on this machine answers at best, so a latency measured
against artsvc can be read against what the stack alone costs.

    python bench/empty_api.py --port 8765 &
    python bench/http_load.py --base http://127.0.0.1:8765 --tokens a,b,c,d,e --get-path /v1/jobs/x --seconds 20
"""

from __future__ import annotations

import argparse

import uvicorn
from fastapi import FastAPI

app = FastAPI()


@app.get("/v1/jobs/{job_id}")
async def get_job(job_id: str) -> dict[str, object]:
    return {"id": job_id, "status": "running", "step": 3}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8765)
    uvicorn.run(app, host="127.0.0.1", port=parser.parse_args().port, log_level="warning", access_log=False)
