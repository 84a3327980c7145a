# lily: `make` builds the CPU engine and tools into build/; `make test` runs every test;
# `make CUDA=1 CUDA_ARCH=sm_90a` adds the GPU backend.
CC      ?= cc
BUILD   ?= build
CFLAGS  ?= -O2 -g
override CFLAGS += -std=gnu11 -Wall -Wextra -Werror -Iinclude -Isrc -MMD -MP -pthread -fno-strict-aliasing
override LDLIBS += -ljansson -lmicrohttpd -lcurl -lcrypto -lpcre2-8 -lutf8proc -lm -pthread
NVCC    ?= $(shell command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
CUDA_ARCH ?= sm_90a
NVFLAGS ?= -O3 -g -lineinfo -std=c++17 --expt-relaxed-constexpr -Iinclude -Isrc \
           -gencode=arch=$(subst sm_,compute_,$(CUDA_ARCH)),code=$(CUDA_ARCH) -Xcompiler -Wall,-Wextra,-Werror

LIB_DIRS := util loader cpu engine tokenizer text convert hub
LIB_SRC  := $(foreach d,$(LIB_DIRS),$(wildcard src/$(d)/*.c))
CU_SRC   := $(wildcard src/cuda/*.cu)
ifeq ($(CUDA),1)
  override CFLAGS += -DLILY_CUDA
  LIB_OBJ_CU := $(CU_SRC:%.cu=$(BUILD)/%.cu.o)
  override LDLIBS += -L$(dir $(NVCC))../lib64 -lcudart -lstdc++
  CUDA_PROGS := $(BUILD)/cuda-kernel-test
else
  LIB_SRC += $(wildcard src/cuda/*.c)
endif
LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/%.o) $(LIB_OBJ_CU)
LIB      := $(BUILD)/liblily.a

PROGS    := $(BUILD)/lily $(BUILD)/lily-server $(BUILD)/lily-bench $(CUDA_PROGS)
TEST_SRC := $(wildcard tests/test_*.c)
TEST_BIN := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
FUZZ_SRC := $(wildcard fuzz/fuzz_*.c)

all: $(PROGS) $(TEST_BIN)

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/%.cu.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -MMD -MP -c $< -o $@

$(LIB): $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/lily: $(patsubst %.c,$(BUILD)/%.o,$(wildcard src/cli/*.c)) $(LIB)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)
$(BUILD)/lily-server: $(patsubst %.c,$(BUILD)/%.o,$(wildcard src/server/*.c)) $(LIB)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)
$(BUILD)/lily-bench: $(patsubst %.c,$(BUILD)/%.o,$(wildcard src/bench/*.c)) $(LIB)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)
$(BUILD)/cuda-kernel-test: $(BUILD)/tests/cuda/kernel_test.o $(LIB)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)
$(BUILD)/tests/%: $(BUILD)/tests/%.o $(LIB)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)

# Fuzzers: clang + libFuzzer over the library rebuilt with sanitizers.
FUZZ_CFLAGS := -std=gnu11 -g -O1 -Iinclude -Isrc -pthread -fsanitize=address,undefined
FUZZ_OBJ := $(patsubst %.c,$(BUILD)/fuzzobj/%.o,$(filter-out src/cuda/%,$(LIB_SRC)) $(wildcard src/cuda/*.c))
$(BUILD)/fuzzobj/%.o: %.c
	@mkdir -p $(dir $@)
	clang $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link -MMD -MP -c $< -o $@
$(BUILD)/fuzz/%: fuzz/%.c $(FUZZ_OBJ)
	@mkdir -p $(dir $@)
	clang $(FUZZ_CFLAGS) -fsanitize=fuzzer $^ -o $@ $(LDLIBS)
fuzz: $(FUZZ_SRC:fuzz/%.c=$(BUILD)/fuzz/%)

# With nvcc present, the whole GPU build (CUDA=1) is compiled and linked into $(BUILD)/cuda,
# so the CUDA sources never rot on GPU-less machines; tests/run.sh then checks that the
# binaries refuse --backend cuda clearly and fall back to the CPU under auto.
cuda-compile-check:
	@if [ -n "$(NVCC)" ] && [ -n "$(CU_SRC)" ]; then \
	  $(MAKE) -s CUDA=1 BUILD=$(BUILD)/cuda $(BUILD)/cuda/lily $(BUILD)/cuda/lily-server || exit 1; \
	  echo "cuda-compile-check: CUDA=1 build of $(words $(CU_SRC)) CUDA files linked into $(BUILD)/cuda"; \
	elif [ -z "$(NVCC)" ]; then echo "cuda-compile-check: no nvcc, skipped"; \
	else echo "cuda-compile-check: no CUDA sources yet"; fi

test: all fuzz
	BUILD=$(BUILD) bash tests/run.sh

clean:
	rm -rf $(BUILD)

.PHONY: all test clean fuzz cuda-compile-check
.SECONDARY:
-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
