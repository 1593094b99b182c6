# Fails when a public header (HEADERS: a ;-separated list of include/onyx/*.h) includes anything but
# another public header ("onyx/...") or a standard C / C++ header (<name>, no folder). The compile
# check in CMakeLists.txt (onyx_public_headers_check) catches src/ headers; this also catches a
# library that happens to be installed in a system directory (<nlohmann/json.hpp>, <oneapi/...>,
# <yaml-cpp/...>), which a public header must not need either. Writes STAMP when all pass.
set(bad "")
foreach(header ${HEADERS})
  file(STRINGS ${header} lines REGEX "^[ \t]*#[ \t]*include")
  foreach(line ${lines})
    if(line MATCHES "^[ \t]*#[ \t]*include[ \t]*\"onyx/[A-Za-z0-9_]+\\.h\"")
    elseif(line MATCHES "^[ \t]*#[ \t]*include[ \t]*<[A-Za-z0-9_.]+>")
    else()
      string(APPEND bad "  ${header}: ${line}\n")
    endif()
  endforeach()
endforeach()
if(bad)
  message(FATAL_ERROR "public headers may include only onyx/*.h and standard headers:\n${bad}")
endif()
file(TOUCH ${STAMP})
