# cmake/minimal.cmake — which sources a minimal build (-DONYX_MINIMAL=ON) leaves out, and the
# stand-ins it compiles instead (each *_absent.cc beside the feature it replaces; the full build
# never compiles those). Included by CMakeLists.txt after ONYX_SOURCES is globbed.
#
#   feature (library)            left out                                   stand-in
#   tokenizers (ICU)             src/tokenizers/{tokenizer,bpe,wordpiece,   src/tokenizers/tokenizers_absent.cc
#                                hf_pipeline,tokenizer_schema}.cc
#   GRPO's regex reward (ICU)    src/train/regex_reward.cc                  src/train/regex_reward_absent.cc
#   audio features (FFTW)        src/data/stft.cc                           src/data/stft_absent.cc
#   images (libpng, libjpeg)     src/data/image_file.cc                     src/data/image_file_absent.cc
#   resampling (libswresample)   src/data/resample.cc                       src/data/resample_absent.cc
#   OpenBLAS GEMM backend        src/kernels/cpu/gemm_openblas.cc           src/kernels/cpu/gemm_openblas_absent.cc
#   data parallelism (MPI)       nothing: src/dist/ runs single-process when MPI is not found
#
# The UTF-8 codec and BERT's Unicode tables (src/tokenizers/text.cc) stay: chat templates and
# datasets use them, and they need no library.
set(ONYX_MINIMAL_LEFT_OUT
  src/tokenizers/tokenizer.cc src/tokenizers/bpe.cc src/tokenizers/wordpiece.cc
  src/tokenizers/hf_pipeline.cc src/tokenizers/tokenizer_schema.cc
  src/train/regex_reward.cc src/data/stft.cc src/data/image_file.cc
  src/data/resample.cc
  src/kernels/cpu/gemm_openblas.cc)
# The unit tests of what a minimal build leaves out: the tokenizers, and the tests that tokenize
# (text datasets, chat templates, GRPO's completions).
set(ONYX_MINIMAL_TESTS_LEFT_OUT
  "/tests/(tokenizers/|data/test_text_datasets|data/test_chat_template|train/test_grpo)")

if(ONYX_MINIMAL)
  list(TRANSFORM ONYX_MINIMAL_LEFT_OUT PREPEND ${CMAKE_SOURCE_DIR}/)
  list(REMOVE_ITEM ONYX_SOURCES ${ONYX_MINIMAL_LEFT_OUT})
else()
  list(FILTER ONYX_SOURCES EXCLUDE REGEX "_absent\\.cc$")
endif()
