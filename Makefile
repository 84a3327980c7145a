# lily: `make` builds the CPU engine and tools into build/; `make test` runs every test;
# `make CUDA=1 CUDA_ARCH=sm_90a` adds the GPU backend.
CC      ?= cc
BUILD   ?= build
CFLAGS  ?= -O2 -g
override CFLAGS += -std=gnu11 -Wall -Wextra -Werror -Iinclude -Isrc -MMD -MP -pthread -fno-strict-aliasing
override LDLIBS += -ljansson -lmicrohttpd -lcurl -lcrypto -lpcre2-8 -lutf8proc -lm -pthread
NVCC    ?= $(shell command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
CUDA_ARCH ?= sm_90a
# The toolkit root is found from nvcc's real path (nvcc may be a symlink in /usr/bin), and
# the CUDA runtime is linked statically so the binaries need only the driver at run time.
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(realpath $(NVCC)))
CUDA_LIBDIR ?= $(firstword $(foreach d,lib64 lib targets/x86_64-linux/lib targets/sbsa-linux/lib,\
                 $(if $(wildcard $(CUDA_HOME)/$(d)/libcudart_static.a),$(CUDA_HOME)/$(d))))
NVFLAGS ?= -O3 -g -lineinfo -std=c++17 --expt-relaxed-constexpr -Iinclude -Isrc \
           -gencode=arch=$(subst sm_,compute_,$(CUDA_ARCH)),code=$(CUDA_ARCH) -Xcompiler -Wall,-Wextra,-Werror \
           $(if $(filter %a,$(CUDA_ARCH)),-DLILY_CU_ARCH_A) $(if $(TRACE),-DLILY_CU_TRACE)

EMU_DIR  := tests/cuda/emu
CXX     ?= g++
EMU_CXXFLAGS ?= -O2 -g
EMU_CXX  = $(CXX) $(EMU_CXXFLAGS) -std=c++17 -Wall -Wextra -Werror -Wno-unknown-pragmas -I$(EMU_DIR) -Iinclude -Isrc \
           -MMD -MP -pthread -fno-strict-aliasing
LIB_DIRS := util loader cpu engine tokenizer text convert hub
LIB_SRC  := $(foreach d,$(LIB_DIRS),$(wildcard src/$(d)/*.c))
CU_SRC   := $(wildcard src/cuda/*.cu)
ifeq ($(CUDA),1)
  override CFLAGS += -DLILY_CUDA
  LIB_OBJ_CU := $(CU_SRC:%.cu=$(BUILD)/%.cu.o)
  override LDLIBS += -L$(CUDA_LIBDIR) -lcudart_static -ldl -lrt -lstdc++
  CUDA_PROGS := $(BUILD)/cuda-kernel-test
else ifeq ($(EMU),1)
  # The CUDA sources on the CPU emulator (tests/cuda/emu): rewritten by cu2cpp.py, compiled as C++.
  override CFLAGS += -DLILY_CUDA
  LIB_OBJ_CU := $(CU_SRC:src/cuda/%.cu=$(BUILD)/emu-src/%.o) $(BUILD)/$(EMU_DIR)/emu_runtime.o
  override LDLIBS += -lstdc++
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

$(BUILD)/emu-src/%.cpp: src/cuda/%.cu $(EMU_DIR)/cu2cpp.py
	@mkdir -p $(dir $@)
	python3 $(EMU_DIR)/cu2cpp.py $< $@
$(BUILD)/emu-src/%.cpp: $(EMU_DIR)/%.cu $(EMU_DIR)/cu2cpp.py
	@mkdir -p $(dir $@)
	python3 $(EMU_DIR)/cu2cpp.py $< $@
$(BUILD)/emu-src/%.o: $(BUILD)/emu-src/%.cpp
	$(EMU_CXX) -c $< -o $@
$(BUILD)/$(EMU_DIR)/emu_runtime.o: $(EMU_DIR)/emu_runtime.cpp
	@mkdir -p $(dir $@)
	$(EMU_CXX) -c $< -o $@
$(BUILD)/emu-selftest: $(BUILD)/emu-src/emu_selftest.o $(BUILD)/$(EMU_DIR)/emu_runtime.o
	$(CXX) $(EMU_CXXFLAGS) -pthread $^ -o $@
# bench/micro/chain.cu (a persistent kernel's chain of stages) on the emulator, for its checks
$(BUILD)/emu-src/%.cpp: bench/micro/%.cu $(EMU_DIR)/cu2cpp.py
	@mkdir -p $(dir $@)
	python3 $(EMU_DIR)/cu2cpp.py $< $@
$(BUILD)/emu-chain: $(BUILD)/emu-src/chain.o $(BUILD)/$(EMU_DIR)/emu_runtime.o
	$(CXX) $(EMU_CXXFLAGS) -pthread $^ -o $@
# A deliberately broken kernel (cu2cpp.py --mutate NAME) linked into its own kernel test.
MUT_SRC = cu_kernels cu_matmul cu_mvq cu_gdn cu_attn cu_moe cu_mvtc cu_mvdp cu_mvdp_comb cu_mvdpb cu_mvdpt cu_test cu_gemm_tc cu_attn_tc cu_gdn_tc cu_router
define MUT_RULES
$$(BUILD)/mutant/%/$(1).cpp: src/cuda/$(1).cu $$(EMU_DIR)/cu2cpp.py
	@mkdir -p $$(dir $$@)
	python3 $$(EMU_DIR)/cu2cpp.py --mutate $$* $$< $$@
$$(BUILD)/mutant/%/$(1).o: $$(BUILD)/mutant/%/$(1).cpp
	$$(EMU_CXX) -c $$< -o $$@
endef
$(foreach f,$(MUT_SRC),$(eval $(call MUT_RULES,$(f))))
# Only the source the mutant changes is rebuilt (cu2cpp.py --target NAME); the rest is the library's.
.SECONDEXPANSION:
$(BUILD)/mutant/%/cuda-kernel-test: $(BUILD)/mutant/%/$$(shell python3 $(EMU_DIR)/cu2cpp.py --target $$*).o \
                                    $(BUILD)/tests/cuda/kernel_test.o $(LIB)
	@rm -f $@.a && cp $(LIB) $@.a && ar d $@.a $(notdir $<) && ar rcs $@.a $<
	$(CC) $(CFLAGS) $(BUILD)/tests/cuda/kernel_test.o $@.a -o $@ $(LDLIBS)

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
	@if [ -z "$(NVCC)" ]; then echo "cuda-compile-check: no nvcc, skipped"; \
	elif [ -z "$(CU_SRC)" ]; then echo "cuda-compile-check: no CUDA sources yet"; \
	elif [ -n "$(CUDA_LIBDIR)" ]; then \
	  $(MAKE) -s CUDA=1 BUILD=$(BUILD)/cuda $(BUILD)/cuda/lily $(BUILD)/cuda/lily-server || exit 1; \
	  echo "cuda-compile-check: CUDA=1 build of $(words $(CU_SRC)) CUDA files linked into $(BUILD)/cuda"; \
	else \
	  $(MAKE) -s CUDA=1 BUILD=$(BUILD)/cuda $(BUILD)/cuda/liblily.a $(BUILD)/cuda/tests/cuda/kernel_test.o || exit 1; \
	  echo "cuda-compile-check: CUDA=1 build of $(words $(CU_SRC)) CUDA files compiled; not linked: no libcudart_static.a under $(CUDA_HOME)"; fi

# The CUDA backend on the CPU emulator (tests/cuda/emu, docs/cuda.md): $(BUILD)/emu/lily and
# $(BUILD)/emu/cuda-kernel-test, no nvcc or GPU needed.
emu:
	@$(MAKE) --no-print-directory EMU=1 BUILD=$(BUILD)/emu $(BUILD)/emu/lily $(BUILD)/emu/cuda-kernel-test $(BUILD)/emu/emu-selftest \
	  $(BUILD)/emu/emu-chain

# The same with AddressSanitizer: kernels' out-of-bounds accesses to device buffers and static
# shared arrays are reported.
EMU_ASAN_FLAGS := -O1 -g -fsanitize=address,alignment -fno-sanitize-recover=alignment -fno-omit-frame-pointer -Wno-maybe-uninitialized
emu-asan:
	@$(MAKE) --no-print-directory EMU=1 BUILD=$(BUILD)/emu-asan CFLAGS="$(EMU_ASAN_FLAGS)" EMU_CXXFLAGS="$(EMU_ASAN_FLAGS)" \
	  $(BUILD)/emu-asan/lily $(BUILD)/emu-asan/cuda-kernel-test $(BUILD)/emu-asan/emu-selftest $(BUILD)/emu-asan/tests/test_sample_gen \
	  $(BUILD)/emu-asan/tests/test_park $(BUILD)/emu-asan/tests/test_batch_gen

test: all fuzz
	BUILD=$(BUILD) bash tests/run.sh

# Every unit test and the server's integration tests under AddressSanitizer and UBSan
# (about 15 minutes on 2 cores; not part of make test): tests/sanitize.sh.
SAN_FLAGS := -O1 -g -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -Wno-maybe-uninitialized
sanitize:
	@$(MAKE) --no-print-directory BUILD=$(BUILD)/san CFLAGS="$(SAN_FLAGS)" all
	BUILD=$(BUILD)/san bash tests/sanitize.sh

clean:
	rm -rf $(BUILD)

.PHONY: all test clean fuzz cuda-compile-check emu emu-asan sanitize
.SECONDARY:
-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
