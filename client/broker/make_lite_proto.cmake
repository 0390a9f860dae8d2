# Copies a .proto and asks protoc for lite code (see CMakeLists.txt for why).
file(READ ${IN} _text)
file(WRITE ${OUT} "${_text}\noption optimize_for = LITE_RUNTIME;\n")
