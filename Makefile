# Thin wrapper over the scripts. `make build` leaves the CLI at build/onyx.
.PHONY: setup build test demo bench clean
setup:
	bash scripts/setup.sh
build:
	bash scripts/build.sh
test:
	bash scripts/test.sh
demo:
	bash scripts/demo.sh
bench:
	bash bench/run.sh
clean:
	rm -rf build build-asan
