"""The fast tier, `python -m pytest -q -m "not slow"`: every stage's tests, the e2e runs at world 2,
in at most 10 minutes on a 2-CPU machine with a cold build cache. CI runs the whole suite.

A test is in the slow tier when its file marks it `slow` (larger worlds and sizes), or when it
is listed below (tests/conftest.py marks it at collection). The entries are the tests that took
2 s or more in a cold fast-tier run (a log of every test's duration, issue 29),
each sent to the slow tier unless it is the one representative of its stage that the fast tier
keeps. What the fast tier keeps of each heavy stage:
- e2e: every example at world 2 against torch (test_run), MoE and int8 MoE at world 2, one check
  that a wrong result fails the run, the constructs (world 4), sync under if at worlds 1 and 2,
  the core balance of place. Translation validation (test_translation, every world) is slow: it builds and
  runs every proven instance of every example and corpus schedule.
- api: three process-group scenarios (interleaved calls, bad input, MoE masks), the Buffer's
  scenarios, two kinds of disagreeing ranks.
- distributed: every collective against torch at world 2, zero-copy and bad-input scenarios, the
  npu refusal, deep_ep in both modes in bf16 at world 2. PyTorch's DistributedTest and DDP are slow.
- bench: one shared collective bench job and one shared MoE bench job with the tests that read them.
- codegen: every text check; the -Werror build of every kernel and the examples proven up to 16
  are slow.
Everything under 2 s stays (about 1,400 tests, 100 s together).
"""


def params(test: str, *ids: str) -> list[str]:
    return [f"{test}[{i}]" for i in ids]


E2E, API, DIST, BENCH = "tests/e2e/", "tests/api/", "tests/distributed/", "tests/bench/"
# node ids; one ending in "*" covers every node id that starts with the rest
SLOW = [
    # e2e
    E2E + "test_translation.py::*",
    *params(E2E + "test_run.py::test_every_example_runs_correctly", "1", "3", "4"),
    *params(E2E + "test_moe.py::test_every_moe_example_runs_correctly", "1", "3", "4"),
    E2E + "test_moe.py::test_place_on_sdma_quiets_within_the_queue_depth",
    E2E + "test_moe.py::test_dispatch_moves_each_routed_row_once_and_balances_the_cores",
    E2E + "test_moe.py::test_staging_baseline_shows_its_copies",
    E2E + "test_moe_int8.py::test_int8_dispatch_moves_about_half_the_bytes_of_bf16",
    E2E + "test_moe_int8.py::test_per_block_scales_land_beside_their_rows",
    *params(E2E + "test_moe_int8.py::test_int8_dispatch_and_bf16_combine_are_bit_exact",
            "3-prefill", "3-decode", "4-prefill", "4-decode"),
    *params(E2E + "test_shared_control_run.py::test_shared_control_blocks_run_correctly", "5"),
    *params(E2E + "test_arrays_run.py::test_schedules_with_arrays_run_correctly", "8"),
    E2E + "test_checks_fail.py::test_no_check_turns_the_same_wrong_result_into_exit_0",
    E2E + "test_checks_fail.py::test_bench_*",
    E2E + "test_checks_fail.py::test_run_moe_says_wrong_for_a_count_a_window_row_and_a_combined_token",
    E2E + "test_checks_fail.py::test_a_malformed_hook_value_is_refused",
    *params(E2E + "test_step_loops.py::test_hierarchical_allreduce_by_composition_runs_correctly", "5"),
    *params(E2E + "test_step_loops.py::test_hierarchical_allreduce_over_teams_runs_correctly", "5"),
    E2E + "test_step_loops.py::test_a_call_on_a_world_the_schedule_excludes_names_the_constraint",
    E2E + "test_precedence.py::test_loop_bound_with_a_bitwise_top_operator_runs_correctly[*",
    E2E + "test_balance.py::test_sdma_copies_split_evenly[*",
    E2E + "test_sync_under_if.py::test_sync_under_if_runs_correctly[3-*",
    E2E + "test_sync_under_if.py::test_sync_under_if_runs_correctly[4-*",
    # api
    API + "test_comm.py::test_a_verdict_on_disk_is_reused_and_a_corrupt_one_is_proven_again",
    API + "test_comm.py::test_bootstrap_from_a_store",
    *params(API + "test_comm.py::test_scenario_process_group", "moe_bad_input", "call_refusals",
            "selecting_entry_point", "moe_interleaved", "cached_calls", "segment_gone", "closed",
            "half_sums_round_once", "moe_bounded", "several_communicators"),
    API + "test_docs.py::*",
    API + "test_buffer.py::test_moe_layer_example_under_torchrun[*",
    API + "test_buffer.py::test_a_mismatch_fails_the_example",
    *params(API + "test_agreement.py::test_ranks_that_call_differently_are_refused_on_every_rank_before_any_write",
            "sizes", "roots", "order", "ops"),
    API + "test_agreement.py::test_a_rank_that_never_calls_is_named_at_the_deadline",
    API + "test_agreement.py::test_one_rank_of_three_calling_differently",
    # distributed
    DIST + "test_torch_suite.py::*",
    DIST + "test_ddp.py::*",
    DIST + "test_backend.py::test_a_rank_that_does_not_call_is_named",
    *params(DIST + "test_backend.py::test_collectives_against_torch", "3"),
    *params(DIST + "test_backend.py::test_scenario", "user_schedule", "explicit_store", "unwaited", "subgroups"),
    DIST + "test_backend.py::test_fallback_error_names_the_op",
    DIST + "test_backend.py::test_the_overhead_example_runs_and_reports_every_variant",
    *params(DIST + "test_deep_ep.py::test_normal_mode", "int8-2", "int8-4", "bf16-4"),
    *params(DIST + "test_deep_ep.py::test_low_latency_mode", "int8-2", "int8-4", "bf16-4"),
    # bench
    BENCH + "test_bench.py::test_agreement_cost_benches_each_schedule_and_its_twin_without_the_check",
    BENCH + "test_bench.py::test_bench_usage_errors",
    BENCH + "test_factors.py::test_run_reports_nccl_size_and_factor[*",
    BENCH + "test_factors.py::test_moe_and_alltoallv_report_received_bytes_without_a_factor",
    BENCH + "test_factors.py::test_bench_cli_json_has_nccl_tests_figures_at_world_3",
    BENCH + "test_bench_backend.py::*",
    # the breakdown run (rank processes, two schedules built and proven) that these tests read
    BENCH + "test_breakdown.py::test_every_schedule_size_and_rank_is_reported",
    BENCH + "test_breakdown.py::test_the_terms_add_up_to_the_wall_time_of_the_call",
    BENCH + "test_breakdown.py::test_the_sqe_term_is_what_the_model_was_told_to_charge",
    BENCH + "test_breakdown.py::test_the_ub_staging_term_counts_the_bytes_read_into_ub",
    BENCH + "test_breakdown.py::test_the_table_prints_each_term_the_sum_and_the_difference",
    BENCH + "test_bench_moe.py::test_skewed_routing_balanced_partition_against_one_core_per_peer",
    BENCH + "test_bench_moe.py::test_every_pair_of_a_file_gets_its_heap",
    BENCH + "test_bench_moe.py::test_cli_moe_sweep",
    BENCH + "test_bench_moe.py::test_alltoallv_is_dispatch_only",
    BENCH + "test_bench_moe.py::test_cli_vs_for_moe_is_refused_without_a_traceback",
    BENCH + "test_bench_moe.py::test_two_pass_places_benches_each_pair_and_its_twin_whose_places_are_not_joined",
    BENCH + "test_moe_vs_torch.py::*",
    BENCH + "test_serving.py::test_serving_sweep_runs_decode_and_prefill_against_torch",
    # cli
    "tests/cli/test_cli.py::test_size_that_is_not_whole_elements_is_refused",
    "tests/cli/test_cli.py::test_size_the_heap_cannot_hold",
    "tests/cli/test_options.py::test_run_max_recv_bounds_the_window_and_an_overflow_is_an_error",
    "tests/cli/test_options.py::test_run_moe_options",
    "tests/cli/test_options.py::test_run_capacity_an_exact_fit_runs_and_one_slot_less_is_refused",
    "tests/cli/test_options.py::test_bench_dtype_op_root_timeout_seed_progress",
    "tests/cli/test_tune.py::test_tune_measures_and_writes_the_table",
    # codegen
    "tests/codegen/test_readable.py::test_kernels_compile_without_warnings",
    "tests/codegen/test_generated.py::test_examples_verify_up_to_16",
    "tests/codegen/test_positions.py::test_every_position_prints_the_ir_value",
    "tests/codegen/test_names.py::test_every_identifier_in_reach_is_a_name_that_builds",
    *params("tests/codegen/test_shapes_run.py::test_shapes_run_correctly", "4"),
    # faults
    "tests/faults/test_run_faults.py::test_cli_timeout_reaches_the_waits_and_a_stopped_rank_is_stopped",
    "tests/faults/test_api_faults.py::test_oversubscribed_ranks_and_cores_complete",
    "tests/faults/test_signals.py::test_sigterm_reaches_the_programs_own_handler_promptly",
    "tests/faults/test_signals.py::test_sigint_in_a_kernel_wait_raises_keyboard_interrupt_promptly",
    "tests/faults/test_signals.py::test_outside_a_launch_a_signal_does_what_it_did[*",
]


def slow_in_fast_tier(nodeid: str) -> bool:
    """Whether the test with this node id (as pytest prints it, from the repository root) belongs to
    the slow tier by the list above."""
    return any(nodeid == p or (p.endswith("*") and nodeid.startswith(p[:-1])) for p in SLOW)
