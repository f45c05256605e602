# Runs at `cmake --install` (install(SCRIPT) from the top CMakeLists.txt), once
# libchorus is in place: makes it findable by the dynamic linker, and so by
# dlopen("libchorus.so.0") and Python's ctypes.util.find_library("chorus"),
# which read ldconfig's cache.
#  - libdir among the directories ldconfig scans, as root: runs ldconfig;
#  - among them, not root: one line saying to run ldconfig as root;
#  - elsewhere (a prefix of one's own): one line saying to set
#    LD_LIBRARY_PATH (or to add the directory to /etc/ld.so.conf.d).
# Staged installs (DESTDIR, packaging) leave it to the package's own hooks.
# Input: CHORUS_LIBDIR (CMAKE_INSTALL_LIBDIR, relative or absolute).
if(IS_ABSOLUTE "${CHORUS_LIBDIR}")
  set(libdir "${CHORUS_LIBDIR}")
else()
  set(libdir "${CMAKE_INSTALL_PREFIX}/${CHORUS_LIBDIR}")
endif()
if(NOT "$ENV{DESTDIR}" STREQUAL "")
  return()
endif()
file(REAL_PATH "${libdir}" libdir_real)

find_program(CHORUS_LDCONFIG ldconfig PATHS /sbin /usr/sbin NO_CACHE)
set(scanned FALSE)
if(CHORUS_LDCONFIG)
  # -v -N -X: list the directories it would scan, change nothing
  execute_process(COMMAND ${CHORUS_LDCONFIG} -v -N -X OUTPUT_VARIABLE out ERROR_QUIET
                  RESULT_VARIABLE rc)
  string(REGEX MATCHALL "(^|\n)/[^:\n]*:" dirs "${out}")
  foreach(d IN LISTS dirs)
    string(REGEX REPLACE "^\n?(.*):$" "\\1" d "${d}")
    if(EXISTS "${d}")
      file(REAL_PATH "${d}" d)
    endif()
    if(d STREQUAL libdir_real)
      set(scanned TRUE)
    endif()
  endforeach()
endif()

execute_process(COMMAND id -u OUTPUT_VARIABLE uid OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
if(scanned AND uid STREQUAL "0")
  execute_process(COMMAND ${CHORUS_LDCONFIG} RESULT_VARIABLE rc)
  if(rc EQUAL 0)
    message(STATUS "Ran ldconfig: ${libdir}/libchorus.so.0 is found by the dynamic linker")
  else()
    message(STATUS "ldconfig failed (${rc}): run it as root so that ${libdir}/libchorus.so.0 "
                   "is found by the dynamic linker")
  endif()
elseif(scanned)
  message(STATUS "To make ${libdir}/libchorus.so.0 found by the dynamic linker (dlopen, "
                 "ctypes.util.find_library), run ldconfig as root: sudo ldconfig")
else()
  message(STATUS "${libdir} is not on the dynamic linker's path: set "
                 "LD_LIBRARY_PATH=${libdir} (or add it to /etc/ld.so.conf.d/ and run ldconfig) "
                 "for dlopen and ctypes.util.find_library(\"chorus\") to find libchorus")
endif()
