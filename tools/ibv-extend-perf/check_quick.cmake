# ctest helper: runs `ibv-extend-perf --quick --json OUT` (direct and brokered scenarios at tiny
# sizes, against a broker the tool starts itself) and checks only that it exits 0 and writes valid
# JSON in which every stable key other tools read is present and numeric. Nothing about speed.
# EMULATOR (a cross build's qemu-user, when the kernel has no binfmt_misc handler) runs the
# tool, and through IBV_EXTEND_PERF_EMULATOR the broker and the workers it starts.
# ONLY=roce runs `--quick --only roce` instead and checks the keys of that scenario (two network
# namespaces, a broker each): where it cannot run (not root, no namespaces) the tool says
# "skipped:" and this prints "SKIPPED", the test's SKIP_REGULAR_EXPRESSION.
cmake_minimum_required(VERSION 3.19)
set(launcher)
if(EMULATOR)
  separate_arguments(emulator UNIX_COMMAND "${EMULATOR}")
  set(launcher ${CMAKE_COMMAND} -E env "IBV_EXTEND_PERF_EMULATOR=${EMULATOR}" ${emulator})
endif()
set(only)
if(ONLY)
  set(only --only ${ONLY})
endif()
execute_process(COMMAND ${launcher} ${PERF} --quick ${only} --json ${OUT} RESULT_VARIABLE rc OUTPUT_VARIABLE log ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  string(REPLACE ";" " " shown "${only}")
  message(FATAL_ERROR "ibv-extend-perf --quick ${shown} exited with ${rc}: ${err}\n${log}")
endif()
file(READ ${OUT} json)
if(ONLY STREQUAL "roce")
  if(err MATCHES "skipped: ([^\n]*)")
    message(STATUS "SKIPPED: ${CMAKE_MATCH_1}")
    return()
  endif()
  set(numeric floors.udp_pingpong_p50_us floors.udp_pingpong_p99_us floors.udp_blast_gbps
      fastpath.roce_write64k_gbps fastpath.roce_write8_rtt_p50_us fastpath.roce_write8_rtt_p99_us
      fastpath.roce_send8_rtt_p50_us fastpath.roce_send8_rtt_p99_us fastpath.roce_write64k_over_udp_blast
      fastpath.roce_write8_lat_over_udp_pingpong fastpath.roce_send8_lat_over_udp_pingpong)
  foreach(key ${numeric})
    string(REPLACE "." ";" path ${key})
    string(JSON type ERROR_VARIABLE jerr TYPE "${json}" ${path})
    if(jerr OR NOT type STREQUAL "NUMBER")
      message(FATAL_ERROR "key ${key} missing from ${OUT} or not a number: ${jerr}\n${err}")
    endif()
  endforeach()
  message(STATUS "ibv-extend-perf --quick --only roce wrote every expected key")
  return()
endif()
set(numeric
  floors.shm_pingpong_p50_ns floors.uds_pingpong_p50_us floors.null_rpc_p50_us floors.null_rpc_p99_us
  floors.memcpy_gbps
  fastpath.write8_p50_ns_direct fastpath.write8_p50_ns_broker fastpath.write8_p99_ns_broker
  fastpath.fastpath_ratio_broker_over_direct fastpath.write8_over_shm_floor fastpath.msg_rate_mwrs
  fastpath.write1m_gbps fastpath.write1m_over_memcpy fastpath.broker_rpcs_during_fastpath
  fastpath.client_syscalls_per_wr
  control.create_qp_p50_us_direct control.create_qp_p50_us_broker control.create_qp_p99_us_broker
  control.create_qp_over_null_rpc control.bringup_p50_us_broker control.ops_per_s_32clients
  control.p99_us_32clients control.ops_over_null_rpc_32clients control.broker_cpu_op_over_null_rpc_32clients
  control.bringup_over_null_rpc
  scale.live_qps scale.sessions scale.broker_bytes_per_qp scale.broker_anon_bytes_per_qp
  scale.broker_state_bytes_per_qp scale.teardown_10k_ms scale.reclaim_after_kill_ms
  fork.fork_ms_unregistered fork.fork_ms_registered fork.fork_ms_per_gib_registered)
# The middleware scenario's rows exist where its programs were found at configure time.
if(UCX)
  list(APPEND numeric middleware.helpers_put_lat_p50_ns middleware.ucx_put_lat_ns middleware.ucx_put_lat_over_helpers
       middleware.helpers_put_bw_mibs middleware.ucx_put_bw_mibs middleware.ucx_put_bw_over_helpers)
endif()
if(MPI)
  list(APPEND numeric middleware.mpi_pingpong_rtt_us middleware.ibv_rc_pingpong_rtt_us middleware.mpi_over_rc_pingpong)
endif()
foreach(key ${numeric} machine.cores machine.kernel machine.cpu machine.date machine.git_commit)
  string(REPLACE "." ";" path ${key})
  string(JSON value ERROR_VARIABLE jerr GET "${json}" ${path})
  if(jerr)
    message(FATAL_ERROR "key ${key} missing from ${OUT}: ${jerr}")
  endif()
  string(JSON type ERROR_VARIABLE jerr TYPE "${json}" ${path})
  if(key IN_LIST numeric AND NOT type STREQUAL "NUMBER")
    message(FATAL_ERROR "key ${key} in ${OUT} is ${type}, not a number")
  endif()
endforeach()
message(STATUS "ibv-extend-perf --quick wrote every expected key")
