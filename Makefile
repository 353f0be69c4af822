# ringlm - one binary, `ringlm`, built from a static library of our own code (build/<variant>/libringlm.a)
# and the pinned ggml (scripts/ggml.sh; GGML_PREFIX=/path uses an installed ggml instead).
#
#   make            release build -> ./ringlm
#   make asan       AddressSanitizer + UBSan build -> build/asan/ringlm
#   make test       the test suite against ./ringlm
#   make check      the test suite against the release and the sanitizer builds (what CI runs)
#   make demo       the main job as it stands
#   make oracle     the llama.cpp oracle (tests/oracle), linked with the prebuilt libllama
#   make arm64      the aarch64 build, cross-compiled (build/arm64/release/ringlm; tests/t_arm64.sh runs it)

CC      ?= cc
CSTD    := -std=c11 -D_GNU_SOURCE
# Messages are cut to their buffers on purpose (err.h), so format truncation is not a bug here.
WARN    := -Wall -Wextra -Werror -Wno-unused-parameter -Wno-format-truncation
PKGS    := libsodium libzmq libmicrohttpd libcjson libpcre2-8
CFLAGS_release := -O2 -g -march=native
CFLAGS_asan    := -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined
LDFLAGS_asan   := -fsanitize=address,undefined -rdynamic
# -rdynamic: the binary exports ggml's symbols to the GPU backend modules it loads (scripts/ggml-backends.sh).
LDFLAGS_release := -rdynamic

# One generated file per ggml source: the pinned build, or an installed one named by GGML_PREFIX; and per
# compiler that builds the pinned one (scripts/ggml.sh takes gcc-11 where installed, for bit-exact kernels):
# a tree built before install-deps brought gcc-11 would otherwise keep a ggml that differs in the last bit.
GGML_CC_TAG := $(if $(RINGLM_GGML_CC),-$(notdir $(RINGLM_GGML_CC)),$(if $(shell command -v gcc-11 2>/dev/null),$(if $(shell command -v g++-11 2>/dev/null),-gcc-11)))
GGML_MK := build/ggml$(if $(GGML_PREFIX),-$(subst /,_,$(GGML_PREFIX)))$(GGML_CC_TAG).mk
# Where the variants' objects and binaries go: build/<variant>/, or build/arm64/<variant>/ for aarch64.
B := build

# RINGLM_CROSS=aarch64 (`make arm64` sets it): the same build for aarch64 with Debian's cross compiler and
# the arm64 -dev packages (multiarch; scripts/install-deps.sh installs them), ggml's kernels of the aarch64
# variant RINGLM_ARM_VARIANT (scripts/ggml-variant.sh). tests/t_arm64.sh runs the result under qemu-user.
ifeq ($(RINGLM_CROSS),aarch64)
CC := aarch64-linux-gnu-gcc
B := build/arm64
CFLAGS_release := -O2 -g
PKG_CONFIG_ENV := PKG_CONFIG_LIBDIR=/usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig
GGML_MK := build/ggml-arm64-$(or $(RINGLM_ARM_VARIANT),default).mk
else ifneq ($(RINGLM_CROSS),)
$(error RINGLM_CROSS=$(RINGLM_CROSS): the only cross target is aarch64)
endif
-include $(GGML_MK)

# Where the GPU backend modules are looked for when RINGLM_BACKEND_DIR is not set (src/device/devices.c).
DEFS := -DRINGLM_BACKEND_DIR='"$(GGML_BACKEND_DIR)"'

PKG_CFLAGS := $(shell $(PKG_CONFIG_ENV) pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS   := $(shell $(PKG_CONFIG_ENV) pkg-config --libs $(PKGS) 2>/dev/null)

LIB_SRC  := $(sort $(wildcard src/base/*.c src/device/*.c src/gguf/*.c src/model/*.c src/text/*.c src/gen/*.c src/speculate/*.c \
                             src/wire/*.c src/exec/*.c src/trust/*.c src/net/*.c src/plan/*.c src/node/*.c \
                             src/coord/*.c src/serve/*.c src/tools/*.c src/prune/*.c))
CLI_SRC  := $(sort $(wildcard src/cli/*.c))
UNIT_SRC := $(sort $(wildcard tests/unit/*.c))
TOOL_SRC := $(sort $(wildcard tests/tools/*.c))

.PHONY: all asan arm64 test check check-full demo oracle clean units_release units_asan adversary
all: ringlm

$(GGML_MK): scripts/ggml.sh scripts/ggml-variant.sh scripts/ggml-backends.sh scripts/pins.env
	@mkdir -p build
	GGML_PREFIX="$(GGML_PREFIX)" RINGLM_CROSS="$(RINGLM_CROSS)" RINGLM_ARM_VARIANT="$(RINGLM_ARM_VARIANT)" \
	    scripts/ggml.sh > $@.tmp && mv $@.tmp $@

# $(1) = variant (release | asan)
define variant
OBJ_$(1) := $$(patsubst %.c,$(B)/$(1)/%.o,$$(LIB_SRC))
CLI_OBJ_$(1) := $$(patsubst %.c,$(B)/$(1)/%.o,$$(CLI_SRC))
$(B)/$(1)/%.o: %.c $(GGML_MK)
	@mkdir -p $$(dir $$@)
	@echo "  CC [$(1)] $$<"
	@$$(CC) $$(CSTD) $$(WARN) $$(CFLAGS_$(1)) $$(DEFS) -I$$(GGML_INC) $$(PKG_CFLAGS) -MMD -MP -c $$< -o $$@
$(B)/$(1)/libringlm.a: $$(OBJ_$(1))
	@rm -f $$@
	@ar rcs $$@ $$^
$(B)/$(1)/ringlm: $$(CLI_OBJ_$(1)) $(B)/$(1)/libringlm.a
	@echo "  LD [$(1)] $$@"
	@$$(CC) $$(LDFLAGS_$(1)) -o $$@ $$^ $$(GGML_LIBS) $$(PKG_LIBS) -lm -lpthread
$(B)/$(1)/unit/%: tests/unit/%.c tests/unit/check.h $(B)/$(1)/libringlm.a
	@mkdir -p $$(dir $$@)
	@echo "  LD [$(1)] $$@"
	@$$(CC) $$(CSTD) $$(WARN) $$(CFLAGS_$(1)) -I$$(GGML_INC) -Isrc $$(PKG_CFLAGS) $$(LDFLAGS_$(1)) -o $$@ $$< \
	    $(B)/$(1)/libringlm.a $$(GGML_LIBS) $$(PKG_LIBS) -lm -lpthread
$(B)/$(1)/tools/%: tests/tools/%.c $(B)/$(1)/libringlm.a
	@mkdir -p $$(dir $$@)
	@echo "  LD [$(1)] $$@"
	@$$(CC) $$(CSTD) $$(WARN) $$(CFLAGS_$(1)) -I$$(GGML_INC) -Isrc $$(PKG_CFLAGS) $$(LDFLAGS_$(1)) -o $$@ $$< \
	    $(B)/$(1)/libringlm.a $$(GGML_LIBS) $$(PKG_LIBS) -lm -lpthread
units_$(1): $$(patsubst tests/unit/%.c,$(B)/$(1)/unit/%,$$(UNIT_SRC)) \
            $$(patsubst tests/tools/%.c,$(B)/$(1)/tools/%,$$(TOOL_SRC))
-include $$(OBJ_$(1):.o=.d) $$(CLI_OBJ_$(1):.o=.d)
endef
$(eval $(call variant,release))
$(eval $(call variant,asan))

# The adversarial node (tests only): the release build with src/node/ and cmd_node.c compiled again with
# -DRINGLM_ADVERSARY, which adds `ringlm node --misbehave MODE` (src/node/node_forward.c). Never shipped: only
# tests/t_trust.sh runs it. Objects given before the library win over the library's own.
# Every file of src/node/: the flag changes the node struct's layout (node_int.h), so none may come from the
# library's build.
ADV_OBJ := $(patsubst %.c,build/adv/%.o,$(wildcard src/node/*.c)) build/adv/src/cli/cmd_node.o
build/adv/%.o: %.c $(GGML_MK)
	@mkdir -p $(dir $@)
	@echo "  CC [adv] $<"
	@$(CC) $(CSTD) $(WARN) $(CFLAGS_release) -DRINGLM_ADVERSARY -I$(GGML_INC) $(PKG_CFLAGS) -MMD -MP -c $< -o $@
build/adv/ringlm: $(ADV_OBJ) $(filter-out build/release/src/cli/cmd_node.o,$(CLI_OBJ_release)) build/release/libringlm.a
	@echo "  LD [adv] $@"
	@$(CC) -rdynamic -o $@ $^ $(GGML_LIBS) $(PKG_LIBS) -lm -lpthread
adversary: build/adv/ringlm
-include $(ADV_OBJ:.o=.d)

# corpus_blob.c embeds the corpus with .incbin, which -MMD cannot see.
$(foreach v,release asan,$(B)/$(v)/src/tools/corpus_blob.o): $(wildcard data/corpus/*.txt)

# Copy then rename: the rename works even while a `ringlm node` is running the old binary.
ringlm: build/release/ringlm
	@cp $< $@.tmp && mv -f $@.tmp $@

asan: build/asan/ringlm units_asan

# The aarch64 build, cross-compiled here (tests/t_arm64.sh runs it under qemu-user): build/arm64/release/ringlm,
# its unit programs, and tests/oracle/oracle-arm64 linked with llama.cpp's prebuilt linux-arm64 build.
arm64: $(GGML_MK)
	$(MAKE) RINGLM_CROSS=aarch64 build/arm64/release/ringlm units_release
	$(MAKE) -C tests/oracle LLAMA_SRC=$(LLAMA_SRC) oracle-arm64

oracle: $(GGML_MK)
	$(MAKE) -C tests/oracle LLAMA_SRC=$(LLAMA_SRC) oracle $(if $(GGML_BACKEND_DIR),oracle-gpu)

# On x86-64 the suite also cross-builds for aarch64 (tests/t_arm64.sh runs it under qemu-user).
ARM64_TEST := $(if $(filter x86_64,$(shell uname -m)),arm64)
test: ringlm units_release oracle adversary $(ARM64_TEST)
	RINGLM_BUILD=build/release tests/run.sh

# The release suite, then against the sanitizer build (compiled only after the first passes): every unit
# program and the tests that feed the binary malformed, hostile or corrupt input (files, frames, HTTP,
# tokenizer text) or walk its small commands. The whole suite twice took 42 minutes on a 2-core machine,
# past CI's 30; the ring, serve and speculation scenarios run on the release build only there, and
# `make check-full` still runs every test against both builds. RINGLM_TEST_QUICK=1 makes test_forward run
# its tiny configs only under the sanitizers: the same paths, fewer shapes.
ASAN_TESTS = test_ fuzz_ =t_hostile =t_corrupt =t_transport =t_serve_clients =t_relay =t_manifest \
             =t_receipts =t_layout =t_synth =t_tokenizer =t_run =t_plan =t_serve_cache
check:
	$(MAKE) test
	$(MAKE) asan
	RINGLM_TEST_QUICK=1 RINGLM_BUILD=build/asan tests/run.sh $(ASAN_TESTS)

check-full:
	$(MAKE) test
	$(MAKE) asan
	RINGLM_BUILD=build/asan tests/run.sh

# The main job: a local demo ring (3 nodes on loopback, a chat prompt with speculative decoding).
demo: ringlm
	scripts/demo.sh

clean:
	rm -rf build ringlm
	$(MAKE) -C tests/oracle clean
