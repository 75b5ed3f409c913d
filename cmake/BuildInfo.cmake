# flash_kda_build_info(OUT_FILE): writes the Python module flash_kda._build_info (version, commit,
# whether the working tree had uncommitted changes, CUDA on or off) at configure time, so that the
# benchmark records the build it measures wherever it runs from.
#
# The commit is flash-kda's own: `git rev-parse HEAD` in the source folder, only when that folder is
# the top of its git checkout (a source tree unpacked inside some other repository gets none of
# that repository's commits). The environment variable FLASH_KDA_COMMIT at build time overrides it
# (e.g. `FLASH_KDA_COMMIT=$(git rev-parse HEAD) pip install .` from a copy without .git, or whose
# .git is older than its files); with neither it is None ("unknown" in the results). `pip install .` configures again on every build, so a
# reinstall after a commit records the new one.
function(flash_kda_build_info out_file)
  set(commit "")
  set(dirty "None")
  set(source "")
  find_package(Git QUIET)
  if(GIT_FOUND AND "$ENV{FLASH_KDA_COMMIT}" STREQUAL "")
    execute_process(COMMAND "${GIT_EXECUTABLE}" rev-parse --show-toplevel
                    WORKING_DIRECTORY "${PROJECT_SOURCE_DIR}" RESULT_VARIABLE rc OUTPUT_VARIABLE top
                    OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    if(rc EQUAL 0)
      file(REAL_PATH "${top}" top)
      file(REAL_PATH "${PROJECT_SOURCE_DIR}" here)
      if(top STREQUAL here)
        execute_process(COMMAND "${GIT_EXECUTABLE}" rev-parse HEAD
                        WORKING_DIRECTORY "${PROJECT_SOURCE_DIR}" RESULT_VARIABLE rc OUTPUT_VARIABLE head
                        OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
        if(rc EQUAL 0)
          set(commit "${head}")
          set(source "git")
          execute_process(COMMAND "${GIT_EXECUTABLE}" status --porcelain --untracked-files=no
                          WORKING_DIRECTORY "${PROJECT_SOURCE_DIR}" RESULT_VARIABLE rc OUTPUT_VARIABLE changes
                          OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
          if(rc EQUAL 0 AND changes STREQUAL "")
            set(dirty "False")
          elseif(rc EQUAL 0)
            set(dirty "True")
          endif()
        endif()
      endif()
    endif()
  endif()
  if(NOT "$ENV{FLASH_KDA_COMMIT}" STREQUAL "")
    set(commit "$ENV{FLASH_KDA_COMMIT}")
    set(source "FLASH_KDA_COMMIT")
    if(NOT commit MATCHES "^[0-9A-Za-z._+-]+$")
      message(FATAL_ERROR "FLASH_KDA_COMMIT='${commit}': expected a commit id (letters, digits, . _ + -)")
    endif()
  endif()
  if(commit STREQUAL "")
    set(FLASH_KDA_INFO_COMMIT "None")
    set(FLASH_KDA_INFO_SOURCE "None")
  else()
    set(FLASH_KDA_INFO_COMMIT "\"${commit}\"")
    set(FLASH_KDA_INFO_SOURCE "\"${source}\"")
  endif()
  set(FLASH_KDA_INFO_DIRTY "${dirty}")
  if(FLASH_KDA_ENABLE_CUDA)
    set(FLASH_KDA_INFO_CUDA "True")
  else()
    set(FLASH_KDA_INFO_CUDA "False")
  endif()
  configure_file("${PROJECT_SOURCE_DIR}/cmake/_build_info.py.in" "${out_file}" @ONLY)
  message(STATUS "flash-kda: build info: commit ${FLASH_KDA_INFO_COMMIT} (${source}), uncommitted changes ${dirty}")
endfunction()
