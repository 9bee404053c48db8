# Targets mirror CI: `.ci/run` runs `make lint` and `make test`.
CARGO ?= cargo

.PHONY: all build test lint fmt demo clean

all: build

## Build every binary (central-outbox, site-forwarder, smtp-sink).
build:
	$(CARGO) build --workspace --bins

## Run the whole test suite. The end-to-end tests start the built binaries, so build them first.
test: build
	$(CARGO) test --workspace

## Formatting and clippy, as CI checks them.
lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

fmt:
	$(CARGO) fmt --all

## Send a few notifications through the whole path on the embedded default and show them delivered.
demo: build
	bash deploy/demo/run.sh

clean:
	$(CARGO) clean
	rm -rf var
