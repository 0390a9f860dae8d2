# ctest helper: runs `ibv-extend-perf --quick --json OUT` and checks only that it exits 0 and
# writes valid JSON with the stable keys other tools read. Nothing about speed.
execute_process(COMMAND ${PERF} --quick --json ${OUT} RESULT_VARIABLE rc OUTPUT_VARIABLE log ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "ibv-extend-perf --quick exited with ${rc}: ${err}")
endif()
file(READ ${OUT} json)
foreach(key floors.shm_pingpong_p50_ns floors.memcpy_gbps fastpath.write8_p50_ns_direct fastpath.msg_rate_mwrs
            fastpath.write1m_gbps fastpath.write1m_over_memcpy fastpath.write8_over_shm_floor machine.cores
            machine.kernel machine.cpu machine.date machine.git_commit)
  string(REPLACE "." ";" path ${key})
  string(JSON value ERROR_VARIABLE jerr GET "${json}" ${path})
  if(jerr)
    message(FATAL_ERROR "key ${key} missing from ${OUT}: ${jerr}")
  endif()
endforeach()
message(STATUS "ibv-extend-perf --quick wrote every expected key")
