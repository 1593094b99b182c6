# Writes OUT: `#define ONYX_GIT_COMMIT "<short hash>[-dirty]"` (empty when SRC is not a git checkout
# or git is missing). Runs at every build (the onyx_git_commit target); the file is rewritten only
# when its text changes, so an unchanged commit recompiles nothing.
set(commit "")
find_program(GIT git)
if(GIT)
  execute_process(COMMAND ${GIT} --no-optional-locks -C ${SRC} rev-parse --short=12 HEAD
                  OUTPUT_VARIABLE commit OUTPUT_STRIP_TRAILING_WHITESPACE
                  RESULT_VARIABLE rc ERROR_QUIET)
  if(NOT rc EQUAL 0)
    set(commit "")
  else()
    execute_process(COMMAND ${GIT} --no-optional-locks -C ${SRC} status --porcelain --untracked-files=no
                    OUTPUT_VARIABLE changes RESULT_VARIABLE rc ERROR_QUIET)
    if(rc EQUAL 0 AND NOT changes STREQUAL "")
      set(commit "${commit}-dirty")
    endif()
  endif()
endif()
set(text "#define ONYX_GIT_COMMIT \"${commit}\"\n")
if(EXISTS ${OUT})
  file(READ ${OUT} old)
else()
  set(old "")
endif()
if(NOT old STREQUAL text)
  file(WRITE ${OUT} "${text}")
endif()
