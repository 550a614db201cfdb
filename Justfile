# Stockade: a cluster scheduler. `just` lists the recipes.
# Every recipe uses the project's .venv, whether or not it is activated.

export PATH := justfile_directory() + "/.venv/bin:" + env_var('PATH')

# List the recipes
default:
    @just --list

# Create .venv (python3.11, else python3) if missing and install Stockade with its dev tools
install:
    #!/usr/bin/env bash
    set -euo pipefail
    if [ ! -x .venv/bin/python ]; then
        python=$(command -v python3.11 || command -v python3)
        "$python" -m venv .venv
    fi
    .venv/bin/pip install -e '.[dev]'

# Start the local cluster, submit 12 jobs, wait 3 s, show the status
demo:
    stockade up
    stockade jobs 12
    sleep 3
    stockade status

# Start the local cluster (database, cp-1..cp-3, w-1..w-5) in the background; safe to repeat
up:
    stockade up

# Build the image stockade:<version> offline (debootstrap base, wheels built here, no network in the build)
image:
    stockade image build

# Start the cluster in containers (database, cp-1..cp-3, w-1..w-5) on a private Docker network
up-docker *ARGS:
    stockade up --docker {{ARGS}}

# Stop every process of the local cluster, the embedded database included
down:
    stockade down

# Submit N sleep jobs of mixed sizes and durations
jobs N="12":
    stockade jobs {{N}}

# Show the leader, the control planes, the workers' load and the job counts (`just status --json` for scripts)
status *ARGS:
    stockade status {{ARGS}}

# SIGKILL the leader and time the takeover
kill-leader:
    stockade kill-leader --wait

# SIGKILL the busiest worker and time until its jobs run elsewhere
kill-worker:
    stockade kill-worker --wait

# Leader-failover torture on a fresh cluster, then the checker (e.g. `just chaos 200 --worker-kills 20`)
chaos FAILOVERS="200" *ARGS:
    stockade chaos {{FAILOVERS}} {{ARGS}}

# Time to a new leader after kills, freezes and clean stops; a killed worker's jobs running elsewhere
bench-failover *ARGS:
    stockade bench failover {{ARGS}}

# Packing benchmark: policies side by side (all at once, arriving), a burst, a scale curve, a PNG (about 20 minutes)
bench-pack *ARGS:
    stockade bench pack {{ARGS}}

# Offered load raised step by step past what the machine can do: goodput per step, a PNG
bench-overload *ARGS:
    stockade bench overload {{ARGS}}

# Scale benchmark: heartbeat and placement costs per worker count (100..2000 simulated workers), a PNG
bench-scale *ARGS:
    stockade bench scale {{ARGS}}

# Check the local cluster's history: no job placed or run twice, every job finished
check *ARGS:
    stockade check {{ARGS}}

# The whole suite: lint, then unit, integration and end-to-end tests
test: lint
    pytest -q

# The edit loop, under a minute: ruff, then the unit tests on two processes with few examples per property test (tests/properties.py)
test-fast:
    ruff check .
    STOCKADE_TEST_PROFILE=fast pytest -q -n 2 tests/unit

# ruff, mypy, the import-layer contract, and the generated protocol code being current
lint:
    ruff check .
    ruff format --check .
    mypy
    lint-imports
    python -m protocol.generate --check

# Regenerate protocol/_generated from protocol/*.proto
proto:
    python -m protocol.generate

# Apply ruff's safe fixes and format the code
fmt:
    ruff check --fix .
    ruff format .
