"""Mutations of README's behaviour promises (issue 21, part 3): cancellation, teardown, errors
and their fields, the ownership model, what crosses with a call (context variables,
exceptions, generator steps), run_sync, nested calls, and the commands' lines and exit codes.

Each one breaks one promise with a plausible one-line slip; its tests are those that must fail.
Limits and security checks are in security.py, time bounds and defaults in bounds.py.
"""

from mutate import Mutation

_CONNECTION = "src/anywool/runtime/client/_connection.py"
_CALL = "src/anywool/runtime/client/_call.py"
_SERVER = "src/anywool/runtime/worker/_server.py"

MUTATIONS: list[Mutation] = [
    # -- cancellation ----------------------------------------------------------------------
    Mutation(
        name="caller-cancellation-becomes-routine-cancelled",
        path=_CALL,
        old="""        except anyio.get_cancelled_exc_class():
            await self.abort()
            raise
        frame = frames.popleft()""",
        new="""        except anyio.get_cancelled_exc_class():
            await self.abort()
            raise RoutineCancelled(self.name, self.connection.address) from None
        frame = frames.popleft()""",
        tests=("tests/integration/test_pool.py::test_cancelling_the_caller_runs_the_routines_finally_on_the_worker",),
        why="README: cancelling an await cancels the routine; the caller's cancellation is re-raised",
    ),
    Mutation(
        name="cancel-does-not-wait-for-the-unwind",
        path=_CALL,
        old="""                            if kind == Kind.CANCELLING:
                                taken = True
                                break""",
        new="""                            if kind == Kind.CANCELLING:
                                return""",
        tests=("tests/integration/test_interrupt.py::test_a_routine_whose_finally_awaits_past_cancel_grace_is_waited_for_not_ended",),
        why="README: its finally blocks have run when the cancellation reaches you",
    ),
    Mutation(
        name="server-ignores-cancel-frame",
        path=_SERVER,
        old="""        if frame.kind == Kind.CANCEL:
            call.cancel()
""",
        new="""        if frame.kind == Kind.CANCEL:
            pass
""",
        tests=("tests/integration/test_pool.py::test_cancelling_the_caller_runs_the_routines_finally_on_the_worker",),
        why="README: cancelling an await cancels the routine on its worker",
    ),
    Mutation(
        name="withdrawn-call-runs-anyway",
        path=_SERVER,
        old="""                call.cancel()
                await anyio.lowlevel.checkpoint()
            await frames.send(Frame(Kind.ACK""",
        new="""                pass
            await frames.send(Frame(Kind.ACK""",
        tests=("tests/integration/test_interrupt.py::test_a_call_cancelled_while_its_worker_still_loads_it_never_runs",),
        why="README: a call that may have started runs at most once; a call cancelled before it "
            "started never runs",
    ),
    Mutation(
        name="call-lost-after-acceptance-counts-as-undelivered",
        path=_CALL,
        old="""            if self.accepted:
                raise lost from None""",
        new="""            if False:
                raise lost from None""",
        tests=("tests/integration/test_faults.py::test_kill_worker_fails_the_call_in_flight_on_that_worker",
               "tests/integration/test_robustness.py::test_a_worker_that_dies_mid_call_fails_that_call_and_is_evicted"),
        why="README: calls in flight on a lost connection raise WorkerError; anything that may "
            "have run runs at most once (only an undelivered call is sent again)",
    ),
    Mutation(
        name="generator-not-closed-when-caller-cancelled",
        path=_SERVER,
        old="""                try:
                    await agen.aclose()
                except anyio.get_cancelled_exc_class():""",
        new="""                try:
                    pass
                except anyio.get_cancelled_exc_class():""",
        tests=("tests/integration/test_promises.py::test_a_stream_cancelled_between_steps_is_closed_on_its_worker_before_the_answer",),
        why="README: cancelling an await cancels the routine on its worker, its finally blocks "
            "run (an async generator is closed on its worker)",
    ),
    Mutation(
        name="nested-call-shielded-from-the-tree",
        path="src/anywool/runtime/worker/_nested.py",
        old="""        return await self._owner._host(self._origin).dispatch(fn, args, kwargs, plain=plain)""",
        new="""        with anyio.CancelScope(shield=True):
            return await self._owner._host(self._origin).dispatch(fn, args, kwargs, plain=plain)""",
        tests=("tests/integration/test_nested.py::test_cancelling_the_outermost_call_cancels_the_whole_tree",),
        why="README: cancelling the outermost call cancels the whole tree",
    ),
    # -- async generator routines ----------------------------------------------------------
    Mutation(
        name="asend-value-dropped",
        path=_CALL,
        old="""                    _NONE if sent is None
                    else serializer.dumps_value(sent, call.name, "the value sent to it"))""",
        new="""                    _NONE)""",
        tests=("tests/integration/test_pool.py::test_async_generator_routine_supports_asend_athrow_aclose",),
        why="README: an async generator routine is driven step by step (asend sends its value)",
    ),
    Mutation(
        name="athrow-sent-as-asend",
        path=_CALL,
        old="""                kind, payload = Kind.ATHROW, Pickled([_exceptions.dumps_exception(exc)])""",
        new="""                kind, payload = Kind.ASEND, _NONE""",
        tests=("tests/integration/test_pool.py::test_async_generator_routine_supports_asend_athrow_aclose",),
        why="README: an async generator routine is driven step by step (athrow throws into it)",
    ),
    # -- errors and their fields -----------------------------------------------------------
    Mutation(
        name="routine-cancelled-fields-swapped",
        path=_SERVER,
        old="""RoutineCancelled(call.name, self.address))""",
        new="""RoutineCancelled(self.address, call.name))""",
        tests=("tests/integration/test_pool.py::test_routine_cancelled_by_its_worker_raises_routine_cancelled",),
        why="README: a routine cancelled by its worker shutting down raises RoutineCancelled "
            "(routine, address)",
    ),
    Mutation(
        name="routine-aborted-without-cause",
        path=_SERVER,
        old="""        aborted.__cause__ = exc""",
        new="""        aborted.__cause__ = None""",
        tests=("tests/integration/test_dispatch_edges.py::test_a_base_exception_arrives_as_routine_aborted_and_the_worker_goes_on",),
        why="README: arrives as anywool.RoutineAborted, with the original as its __cause__",
    ),
    Mutation(
        name="no-workers-without-namespace",
        path="src/anywool/runtime/client/_proxy.py",
        old="""        raise NoWorkersAvailable(await self._why_none(), self._namespace)""",
        new="""        raise NoWorkersAvailable(await self._why_none())""",
        tests=("tests/integration/test_no_workers.py::test_a_pool_that_spawns_none_where_none_are_published_says_so",),
        why="README: NoWorkersAvailable, whose namespace and message say where it looked",
    ),
    Mutation(
        name="no-workers-reason-omits-the-tags",
        path="src/anywool/runtime/client/_proxy.py",
        old="""f"every tag of {sorted(self._tags or ())} {waited}\"""",
        new="""f"every tag {waited}\"""",
        tests=("tests/integration/test_no_workers.py::test_a_pool_requiring_tags_no_published_worker_has_names_them",),
        why="README: NoWorkersAvailable's message says why it found none (the workers there "
            "lack the pool's tags)",
    ),
    Mutation(
        name="namespace-in-use-fields-swapped",
        path="src/anywool/discovery/local/_claim.py",
        old="""        return DiscoveryNamespaceInUse(namespace, str(target), _owner_pid(target))""",
        new="""        return DiscoveryNamespaceInUse(str(target), namespace, _owner_pid(target))""",
        tests=("tests/integration/test_faults.py::test_owner_process_raises_the_error_that_kept_the_child_from_owning",),
        why="README: a second claim raises DiscoveryNamespaceInUse (its namespace and owner)",
    ),
    Mutation(
        name="borrowing-a-missing-namespace-raises-file-not-found",
        path="src/anywool/discovery/local/_binding.py",
        old="""    except (FileNotFoundError, NotADirectoryError):
        raise DiscoveryNamespaceNotFound(namespace) from None""",
        new="""    except NotADirectoryError:
        raise DiscoveryNamespaceNotFound(namespace) from None""",
        tests=("tests/integration/test_cross_process.py::test_borrowing_pool_on_missing_namespace_raises_not_found",),
        why="README: borrowers raise DiscoveryNamespaceNotFound when no live owner holds it",
    ),
    Mutation(
        name="routine-without-pool-raises-lookup-error",
        path="src/anywool/runtime/_routine.py",
        old="""        raise RuntimeError(
            "cannot dispatch a routine: no WorkerPool""",
        new="""        raise LookupError(
            "cannot dispatch a routine: no WorkerPool""",
        tests=("tests/integration/test_run_sync.py::test_run_sync_with_no_pool_active_raises_runtime_error",),
        why="README: calling a routine with no pool active raises RuntimeError",
    ),
    Mutation(
        name="run-sync-accepts-a-routine",
        path="src/anywool/runtime/_routine.py",
        old="""inspect.isasyncgenfunction(fn) or is_routine(fn):""",
        new="""inspect.isasyncgenfunction(fn):""",
        tests=("tests/integration/test_run_sync.py::test_an_async_function_or_routine_is_refused_with_type_error_before_anything_is_sent",),
        why="README: run_sync of a routine raises TypeError (await a routine instead)",
    ),
    # -- context variables -----------------------------------------------------------------
    Mutation(
        name="context-not-applied-on-the-worker",
        path=_SERVER,
        old="""                _context.apply(values)
                await self._run_coroutine""",
        new="""                await self._run_coroutine""",
        tests=("tests/integration/test_context.py::test_the_callers_values_reach_the_routine_and_its_nested_calls",),
        why="README: a call carries the values its caller has set for every anywool.ContextVar",
    ),
    Mutation(
        name="context-changes-lost-when-the-routine-raises",
        path=_CALL,
        old="""                data, changes = envelope.decode_reply(frame.payload)
                self._update(changes)
            except (FrameError""",
        new="""                data, changes = envelope.decode_reply(frame.payload)
            except (FrameError""",
        tests=("tests/integration/test_context.py::test_what_the_routine_sets_is_set_in_the_caller_after_the_await",),
        why="README: what the routine sets is set in the caller's context when the await "
            "returns (or raises)",
    ),
    Mutation(
        name="context-changes-lost-when-the-routine-returns",
        path=_CALL,
        old="""        data, changes = envelope.decode_reply(frame.payload)
        self._update(changes)
        return serializer""",
        new="""        data, changes = envelope.decode_reply(frame.payload)
        return serializer""",
        tests=("tests/integration/test_context.py::test_what_the_routine_sets_is_set_in_the_caller_after_the_await",),
        why="README: what the routine sets is set in the caller's context when the await returns",
    ),
    Mutation(
        name="context-not-applied-at-a-generator-step",
        path=_SERVER,
        old="""                _context.apply(values)
                traced = None if call.telemetry is None else call.telemetry.step(step.trace)""",
        new="""                traced = None if call.telemetry is None else call.telemetry.step(step.trace)""",
        tests=("tests/integration/test_context.py::test_values_travel_at_every_step_of_an_async_generator",),
        why="README: an async generator routine does the same at every step",
    ),
    Mutation(
        name="current-task-caller-id-dropped",
        path=_CONNECTION,
        old="""        caller = _running_task_id()""",
        new="""        caller = None""",
        tests=("tests/integration/test_nested.py::test_a_routine_calls_routines_three_levels_deep",),
        why="README: current_task().caller_id is the id of the call of the routine that called "
            "this one",
    ),
    # -- exceptions crossing ---------------------------------------------------------------
    # (Dropping __context__ from _exceptions._dump_nodes is only seen for a graph that cannot
    # pickle whole, which is the exception-group work's to pin.)
    Mutation(
        name="exception-pickled-without-its-traceback-and-chain",
        path="src/anywool/runtime/wire/_exceptions.py",
        old="""    pickling_support.install(*classes)""",
        new="""    pass""",
        tests=("tests/integration/test_pool.py::test_exception_arrives_with_type_message_and_remote_traceback",
               "tests/integration/test_dispatch_edges.py::test_a_task_groups_exception_group_arrives_whole_on_both_backends"),
        why="README: what a routine raises reaches the caller with its type, message, "
            "traceback, __cause__ and __context__",
    ),
    # -- teardown: nothing left ------------------------------------------------------------
    Mutation(
        name="owner-exit-leaves-its-files",
        path="src/anywool/discovery/local/_claim.py",
        old="""                _remove_generation(self.root, self.path, self.dir_fd)""",
        new="""                pass""",
        tests=("tests/unit/test_local_discovery.py::test_entry_claims_and_exit_removes_everything",),
        why="README: the owner's exit removes every file of the namespace",
    ),
    Mutation(
        name="killed-worker-socket-left-behind",
        path="src/anywool/runtime/pool/_local_worker.py",
        old="""                await process.aclose()
            self._remove_socket()""",
        new="""                await process.aclose()""",
        tests=("tests/integration/test_faults.py::test_kill_worker_makes_the_pool_withdraw_and_replace_the_worker",),
        why="README: a pool's exit leaves nothing on disk (a killed worker's socket directory "
            "is removed once it is reaped)",
    ),
    Mutation(
        name="exit-does-not-ask-workers-to-cancel",
        path="src/anywool/runtime/client/_proxy.py",
        old="""                    await connection.cancel_all()""",
        new="""                    pass""",
        tests=("tests/integration/test_pool_teardown.py::test_calls_still_running_at_shutdown_timeout_are_cancelled_on_their_worker",),
        why="README: calls still running after shutdown_timeout are cancelled: they raise "
            "RoutineCancelled after their finally blocks ran",
    ),
    Mutation(
        name="exiting-proxy-keeps-taking-calls",
        path="src/anywool/runtime/client/_proxy.py",
        old="""        self._active = False
        _telemetry.watch(self, False)""",
        new="""        _telemetry.watch(self, False)""",
        tests=("tests/integration/test_pool_teardown.py::test_a_call_made_after_exit_began_is_refused",),
        why="README: on exit a pool stops taking calls (a late call raises RuntimeError)",
    ),
    Mutation(
        name="borrower-creates-the-runtime-directory",
        path="src/anywool/discovery/local/_binding.py",
        old="""root or runtime_dir(create=False))""",
        new="""root or runtime_dir(create=True))""",
        tests=("tests/unit/test_local_discovery.py::test_publisher_on_missing_namespace_raises_and_creates_nothing",
               "tests/unit/test_local_discovery.py::test_subscriber_on_missing_namespace_raises_and_creates_nothing"),
        why="README: borrowers never create anything (not even the runtime directory)",
    ),
    # -- commands --------------------------------------------------------------------------
    Mutation(
        name="worker-command-never-says-stopped",
        path="src/anywool/cli/_worker_command.py",
        old="""    _say("stopped")""",
        new="""    pass""",
        tests=("tests/integration/test_worker_command.py::test_a_pool_elsewhere_dispatches_to_the_hosted_workers",),
        why="README: on SIGINT or SIGTERM it prints stopping, ..., prints stopped and exits 0",
    ),
    Mutation(
        name="watch-of-an-unowned-namespace-exits-0",
        path="src/anywool/cli/_watch_command.py",
        old="""                    return f"namespace {namespace!r} has no live owner{elsewhere}\"""",
        new="""                    return None""",
        tests=("tests/integration/test_ops_cli.py::test_an_unknown_namespace_is_exit_1",),
        why="README: a namespace without a live owner when the watch starts is exit status 1",
    ),
    Mutation(
        name="reclaim-of-an-unknown-namespace-exits-0",
        path="src/anywool/cli/_reclaim_command.py",
        old="""            if state is None:
                raise click.ClickException(""",
        new="""            if state is None:
                raise SystemExit(0) or click.ClickException(""",
        tests=("tests/integration/test_ops_cli.py::test_an_unknown_namespace_is_exit_1",),
        why="README: exit status 1 means no generation of NS exists (show, reclaim NS)",
    ),
    # -- second round ----------------------------------------------------------------------
    Mutation(
        name="teardown-forceful-part-not-shielded",
        path="src/anywool/_teardown.py",
        old="""        with anyio.CancelScope(shield=True), anyio.move_on_after(forceful_timeout) as scope:""",
        new="""        with anyio.CancelScope(), anyio.move_on_after(forceful_timeout) as scope:""",
        tests=("tests/integration/test_pool_teardown.py::test_cancelling_the_task_exiting_a_pool_leaks_no_worker",),
        why="README: cancelling an exit ends its waiting, and the workers are still terminated "
            "and reaped before the cancellation propagates",
    ),
    Mutation(
        name="pool-is-not-single-use",
        path="src/anywool/_owner.py",
        old="""        if self._entered:""",
        new="""        if False:""",
        tests=("tests/integration/test_pool.py::test_pool_is_single_use",),
        why="README/STYLE: an owner is a scope, entered once (a second entry raises RuntimeError)",
    ),
    Mutation(
        name="pool-takes-a-discovery-another-pool-entered",
        path="src/anywool/runtime/pool/_pool.py",
        old="""            if id(discovery) in _ENTERED_BY_POOLS:""",
        new="""            if False:""",
        tests=("tests/integration/test_pool_modes.py::test_a_discovery_another_pool_entered_is_refused",),
        why="README: a discovery a pool entered belongs to that pool: giving the same instance to "
            "a second pool raises RuntimeError",
    ),
    Mutation(
        name="pool-enters-a-discovery-its-caller-entered",
        path="src/anywool/runtime/pool/_pool.py",
        old="""        def is_value(obj: object) -> bool:
            if _is_entered(obj):""",
        new="""        def is_value(obj: object) -> bool:
            if False:""",
        tests=("tests/integration/test_pool_modes.py::test_a_discovery_its_caller_entered_serves_two_pools",),
        why="README: a LocalDiscovery you entered yourself stays yours",
    ),
    Mutation(
        name="undelivered-call-not-tried-elsewhere",
        path="src/anywool/runtime/client/_loadbalancer.py",
        old="""            except CallNotDelivered as exc:
                last = exc""",
        new="""            except CallNotDelivered as exc:
                raise""",
        tests=("tests/integration/test_admission.py::test_a_worker_at_its_bound_refuses_a_call_before_running_it",
               "tests/integration/test_dispatch_edges.py::test_a_draining_worker_loses_no_call_under_load"),
        why="README: a full worker refuses a call before running any of it, and the load "
            "balancer tries the next worker",
    ),
    Mutation(
        name="dead-worker-not-withdrawn",
        path="src/anywool/runtime/pool/_supervisor.py",
        old="""                                            "replacing it", worker.pid, code)
                            await self.withdraw(worker)""",
        new="""                                            "replacing it", worker.pid, code)
                            self._disown(worker)""",
        tests=("tests/integration/test_faults.py::test_kill_worker_makes_the_pool_withdraw_and_replace_the_worker",
               "tests/integration/test_pool_modes.py::test_a_spawned_worker_that_dies_is_withdrawn_and_replaced"),
        why="README: a spawned worker that dies is withdrawn from discovery at once and replaced",
    ),
    Mutation(
        name="call-deadline-not-carried",
        path=_CONNECTION,
        old="""            None if streaming else seconds_left(),""",
        new="""            None,""",
        tests=("tests/integration/test_dispatch_edges.py::test_the_callers_deadline_travels_with_the_call",),
        why="README: the caller's effective deadline goes with the call; the routine runs under "
            "it on the worker",
    ),
    Mutation(
        name="step-deadline-not-carried",
        path=_CALL,
        old="""Step(value, seconds_left(), dump_context(self.name),""",
        new="""Step(value, None, dump_context(self.name),""",
        tests=("tests/integration/test_dispatch_edges.py::test_current_task_describes_the_call_on_its_worker",),
        why="README: an async generator's steps each carry the deadline in effect where that "
            "step is awaited",
    ),
    Mutation(
        name="orphaned-subscription-drops-nothing",
        path="src/anywool/discovery/_hub.py",
        old="""                events = [DiscoveryEvent("worker-dropped", m) for m in self.view.values()]""",
        new="""                events = []""",
        tests=("tests/unit/test_local_discovery.py::test_owner_exit_drops_workers_then_successor_appears",),
        why="README: when the owner exits, a live subscription reports worker-dropped for every "
            "worker it knew, then follows the successor",
    ),
    Mutation(
        name="orphaned-publisher-keeps-its-dead-binding",
        path="src/anywool/discovery/local/_local.py",
        old="""                if rebind and (held is None or not held.binding.is_live()):""",
        new="""                if rebind and held is None:""",
        tests=("tests/unit/test_local_discovery.py::test_orphaned_publisher_raises_then_rebinds_to_successor",),
        why="README: when the owner exits, a publish raises DiscoveryNamespaceNotFound unless a "
            "successor owner has claimed the namespace (the publisher then rebinds to it)",
    ),
    Mutation(
        name="worker-command-never-says-stopping",
        path="src/anywool/cli/_worker_command.py",
        old="""                    _say("stopping")
                    stop.set()""",
        new="""                    stop.set()""",
        tests=("tests/integration/test_worker_command.py::test_a_pool_elsewhere_dispatches_to_the_hosted_workers",
               "tests/integration/test_worker_command.py::test_a_second_signal_cuts_the_drain_short"),
        why="README: on SIGINT or SIGTERM it prints stopping",
    ),
    Mutation(
        name="worker-command-line-without-pid",
        path="src/anywool/cli/_worker_command.py",
        old="""                    _say(f"worker {hosted.address} pid {hosted.pid}")""",
        new="""                    _say(f"worker {hosted.address}")""",
        tests=("tests/integration/test_worker_command.py::test_a_pool_elsewhere_dispatches_to_the_hosted_workers",),
        why="README: prints one `worker <address> pid <pid>` line per worker and `ready`",
    ),
    Mutation(
        name="show-of-an-unknown-namespace-exits-0",
        path="src/anywool/cli/_show_command.py",
        old="""        raise click.ClickException(f"no generation of namespace {namespace!r} in {where(root)}")
    if as_json:""",
        new="""        return
    if as_json:""",
        tests=("tests/integration/test_ops_cli.py::test_an_unknown_namespace_is_exit_1",),
        why="README: exit status 1 means that no generation of NS exists (show, reclaim NS)",
    ),
    Mutation(
        name="kill-worker-of-a-pool-without-spawned-workers",
        path="src/anywool/testing/_faults.py",
        old="""    if not workers:
        raise ValueError(""",
        new="""    if not workers:
        raise RuntimeError(""",
        tests=("tests/integration/test_faults.py::test_kill_worker_refuses_a_pool_that_runs_no_spawned_worker",),
        why="README: kill_worker: ValueError when the pool runs no spawned worker",
    ),
    # -- processes that end by themselves, and Ctrl-C ------------------------------------------
    Mutation(
        name="worker-ignores-stdin-eof",
        path=_SERVER,
        old="""            if not chunk:
                self.stop.request(0)
                return""",
        new="""            if not chunk:
                return""",
        tests=("tests/integration/test_pool.py::test_worker_process_exits_and_removes_its_socket_at_stdin_eof",),
        why="README: a pool killed with SIGKILL leaves nothing running: its workers notice "
            "their stdin close and stop",
    ),
    Mutation(
        name="worker-ignores-its-parents-death",
        path=_SERVER,
        old="""        await anyio.wait_readable(pidfd)
        self.stop.request(0)""",
        new="""        await anyio.wait_readable(pidfd)""",
        tests=("tests/integration/test_pool_teardown.py::test_a_worker_stops_gracefully_when_its_pool_dies_while_its_stdin_is_held_elsewhere",),
        why="README: a pool killed with SIGKILL leaves nothing running: its workers notice "
            "their parent exit and stop",
    ),
    Mutation(
        name="workers-share-the-scripts-session",
        path="src/anywool/runtime/pool/_local_worker.py",
        old="""                start_new_session=True)""",
        new="""                start_new_session=False)""",
        tests=("tests/integration/test_ctrl_c.py::test_ctrl_c_to_the_process_group_ends_the_script_promptly_and_leaves_nothing",),
        why="README: workers run in sessions of their own, so a terminal's Ctrl-C reaches the "
            "script alone, which stops them",
    ),
    Mutation(
        name="ctrl-c-during-exit-swallowed",
        path="src/anywool/runtime/client/_ctrl_c.py",
        old="""                previous(signal.SIGINT, sys._getframe())""",
        new="""                pass""",
        tests=("tests/integration/test_ctrl_c.py::test_a_ctrl_c_while_the_pool_exits_hurries_the_exit_and_still_ends_the_script",),
        why="README: a Ctrl-C during the exit hurries it; the script still ends with "
            "KeyboardInterrupt",
    ),
]
