# Renders one man page: cmake -DRENDERER=go-md2man|pandoc -DTOOL=<program> -DSRC=<page>.md
#   -DOUT=<page> -DNAME=<name> -DSECTION=<n> -DVERSION=<version> -DMANUAL=<manual> -P render.cmake
# The sources carry no title line because the two renderers read it differently: pandoc takes
# "% NAME(SECTION) FOOTER | HEADER", go-md2man copies the line after "% " into .TH verbatim, so it
# must already be .TH's arguments. The version comes from project(), never from the sources.
foreach(arg RENDERER TOOL SRC OUT NAME SECTION VERSION MANUAL)
  if(NOT DEFINED ${arg})
    message(FATAL_ERROR "render.cmake: -D${arg}= is missing")
  endif()
endforeach()

string(TOUPPER "${NAME}" title)
if(RENDERER STREQUAL "pandoc")
  set(title_line "% ${title}(${SECTION}) ibv-extend ${VERSION} | ${MANUAL}")
  set(render ${TOOL} --standalone --from markdown-smart --to man)
elseif(RENDERER STREQUAL "go-md2man")
  set(title_line "% ${title} ${SECTION} \"\" \"ibv-extend ${VERSION}\" \"${MANUAL}\"")
  set(render ${TOOL} -in)
else()
  message(FATAL_ERROR "render.cmake: unknown RENDERER '${RENDERER}' (go-md2man or pandoc)")
endif()

file(READ "${SRC}" body)
set(titled "${OUT}.md")
file(WRITE "${titled}" "${title_line}\n\n${body}")
if(RENDERER STREQUAL "pandoc")
  execute_process(COMMAND ${render} "${titled}" -o "${OUT}" RESULT_VARIABLE rc)
else()
  execute_process(COMMAND ${render} "${titled}" -out "${OUT}" RESULT_VARIABLE rc)
endif()
if(NOT rc EQUAL 0)
  file(REMOVE "${OUT}")
  message(FATAL_ERROR "render.cmake: ${RENDERER} failed on ${SRC} (${rc})")
endif()
