"""Issue 21, part 1: the security checks, limits and filters README.md promises.

Each mutation breaks one promise; the tests named for it must fail. Limits are broken on both
sides of their edge (the documented value refused, one past it accepted), security checks one
case at a time (each permission bit of the secret file, each side of the handshake), filters by
admitting what they must exclude.
"""

from mutate import Mutation

_LIMITS = "tests/unit/test_limits.py"
_FILE_BITS = "tests/unit/test_limits.py::test_a_secret_file_any_group_or_other_permission_refuses"

MUTATIONS: list[Mutation] = [
    # -- the secret file ---------------------------------------------------------------------
    *[
        Mutation(
            name=f"secret-file-accepts-{who}-{what}",
            path="src/anywool/cli/_worker_command.py",
            old="if mode & (stat.S_IRWXG | stat.S_IRWXO):",
            new=f"if mode & (stat.S_IRWXG | stat.S_IRWXO) & ~stat.{bit}:",
            tests=(_FILE_BITS,),
            why="README: the secret file is refused if its group or others have any permission",
        )
        for who, what, bit in [
            ("group", "read", "S_IRGRP"), ("group", "write", "S_IWGRP"),
            ("group", "exec", "S_IXGRP"), ("other", "read", "S_IROTH"),
            ("other", "write", "S_IWOTH"), ("other", "exec", "S_IXOTH"),
        ]
    ],
    Mutation(
        name="secret-file-accepts-group-permissions",
        path="src/anywool/cli/_worker_command.py",
        old="if mode & (stat.S_IRWXG | stat.S_IRWXO):",
        new="if mode & stat.S_IRWXO:",
        tests=(_FILE_BITS,),
        why="README: the secret file is refused if its group ... have any permission (issue 21)",
    ),
    Mutation(
        name="secret-file-refuses-owner-only",
        path="src/anywool/cli/_worker_command.py",
        old="if mode & (stat.S_IRWXG | stat.S_IRWXO):",
        new="if mode & (stat.S_IRWXU | stat.S_IRWXG | stat.S_IRWXO):",
        tests=(f"{_LIMITS}::test_a_secret_file_only_its_owner_may_access_is_accepted",),
        why="README: chmod 600 ~/.anywool-secret is how to make the file acceptable",
    ),
    Mutation(
        name="secret-file-keeps-whitespace",
        path="src/anywool/cli/_worker_command.py",
        old="secret = data.strip()",
        new="secret = data",
        tests=(f"{_LIMITS}::test_a_secret_file_sheds_surrounding_whitespace",),
        why="README: surrounding whitespace is not part of the secret",
    ),
    # -- the shared secret's length ----------------------------------------------------------
    Mutation(
        name="secret-min-length-15",
        path="src/anywool/_secret.py",
        old="MIN_LENGTH = 16",
        new="MIN_LENGTH = 15",
        tests=(f"{_LIMITS}::test_a_secret_of_15_bytes_is_refused_naming_the_parameter",),
        why="README: the secret (at least 16 bytes)",
    ),
    Mutation(
        name="secret-16-bytes-refused",
        path="src/anywool/_secret.py",
        old="if len(secret) < MIN_LENGTH:",
        new="if len(secret) <= MIN_LENGTH:",
        tests=(f"{_LIMITS}::test_a_secret_of_16_bytes_is_accepted",),
        why="README: the secret (at least 16 bytes): exactly 16 is enough",
    ),
    Mutation(
        name="secret-file-short-accepted",
        path="src/anywool/cli/_worker_command.py",
        old='return _secret.resolve(secret, "the secret in --secret-file")',
        new='return secret',
        tests=(f"{_LIMITS}::test_a_secret_file_of_15_bytes_is_refused",),
        why="README: put the secret (at least 16 bytes) in a file",
    ),
    Mutation(
        name="env-secret-short-accepted",
        path="src/anywool/_secret.py",
        old='secret, parameter = os.fsencode(text), f"${ENV}"',
        new='return os.fsencode(text)',
        tests=(f"{_LIMITS}::test_a_short_secret_in_the_environment_is_refused_naming_it",),
        why="DESIGN §8: secret= or ANYWOOL_SECRET, at least 16 bytes",
    ),
    # -- the handshake (already pinned by tests/unit/test_auth.py) ---------------------------
    Mutation(
        name="worker-accepts-any-client-proof",
        path="src/anywool/runtime/wire/_auth.py",
        old="    if not hmac.compare_digest(their_proof, expected):\n        with anyio",
        new="    if False:\n        with anyio",
        tests=("tests/unit/test_auth.py::test_wrong_secret_is_rejected_on_both_sides",),
        why="README: every TCP connection is authenticated both ways (wrong secret refused)",
    ),
    Mutation(
        name="client-accepts-any-worker-proof",
        path="src/anywool/runtime/wire/_auth.py",
        old="    if not hmac.compare_digest(their_proof, expected):\n        raise _Failed(\"the worker",
        new="    if False:\n        raise _Failed(\"the worker",
        tests=("tests/unit/test_auth.py::test_client_refuses_a_worker_that_cannot_prove_the_secret",),
        why="README: authenticated both ways: the peer authenticates the listener",
    ),
    Mutation(
        name="worker-without-secret-accepts-client-with-one",
        path="src/anywool/runtime/wire/_auth.py",
        old="    if mine & _FLAG_SECRET and not other & _FLAG_SECRET:",
        new="    if False:",
        tests=("tests/unit/test_auth.py::test_secret_on_one_side_only_is_named_on_both_sides",),
        why="README: a pool with none for a TCP worker raises AuthenticationError",
    ),
    Mutation(
        name="handshake-ignores-a-reflected-hello",
        path="src/anywool/runtime/wire/_auth.py",
        old="if role == ours[_PREFIX:_PREFIX + 1] or theirs[-_NONCE:] == ours[-_NONCE:]:",
        new="if False:",
        tests=("tests/unit/test_auth.py::test_a_hello_reflected_back_is_refused_by_the_client",),
        why="DESIGN §8: a mutual challenge-response over fresh nonces from both sides",
    ),
    Mutation(
        name="proof-not-bound-to-the-address",
        path="src/anywool/runtime/wire/_auth.py",
        old="where = address.encode()",
        new="where = b''",
        tests=("tests/unit/test_auth.py::test_a_proof_for_another_address_is_rejected",),
        why="README: a replayed advert can never point calls at another address",
    ),
    Mutation(
        name="server-reads-past-a-failed-proof",
        path="src/anywool/runtime/wire/_auth.py",
        old="data += await channel.receive(size - len(data))",
        new="data += await channel.receive(65536)",
        tests=("tests/unit/test_auth.py::test_server_reads_nothing_past_a_failed_proof",),
        why="DESIGN §8: a failed peer is disconnected before its first payload is read",
    ),
    Mutation(
        name="pool-listens-on-tcp-without-credentials",
        path="src/anywool/runtime/pool/_local_worker.py",
        old="    if credentials is None:\n        raise ValueError(\n            f\"host={host!r}",
        new="    if False:\n        raise ValueError(\n            f\"host={host!r}",
        tests=("tests/integration/test_tcp.py::"
               "test_tcp_without_credentials_is_refused_at_construction",),
        why="README: TCP without credentials is refused when the pool is constructed",
    ),
    Mutation(
        name="worker-listens-on-tcp-without-credentials",
        path="src/anywool/runtime/worker/_main.py",
        old="if address is not None and not address.is_unix and credentials is None:",
        new="if False:",
        tests=("tests/integration/test_dispatch_edges.py::"
               "test_a_worker_refuses_to_listen_on_tcp_without_credentials",),
        why="DESIGN §8: a TCP listener authenticates its peer before unpickling anything",
    ),
    Mutation(
        name="secret-left-in-worker-environment",
        path="src/anywool/runtime/worker/_main.py",
        old="_secret.inherit(os.environ.pop(SECRET_ENV, None))",
        new="_secret.inherit(os.environ.get(SECRET_ENV))",
        tests=("tests/integration/test_tcp.py::"
               "test_the_secret_is_not_on_the_command_line_nor_left_in_the_environment",),
        why="_contract: the worker takes the secret out of its environment at start-up",
    ),
    Mutation(
        name="tls-encrypted-key-not-named",
        path="src/anywool/_tls.py",
        old="    raise _EncryptedKey\n",
        new="    return b\"\"\n",
        tests=("tests/unit/test_auth.py::test_mutual_tls_refuses_an_encrypted_key",),
        why="README: a key file with a pass phrase is refused",
    ),
    # -- signed LAN records ------------------------------------------------------------------
    Mutation(
        name="lan-record-signature-unchecked",
        path="src/anywool/discovery/lan/_service.py",
        old="if signature is None or not hmac.compare_digest(",
        new="if signature is None and not hmac.compare_digest(",
        tests=("tests/unit/test_lan_service.py",),
        why="README: a subscriber with a secret ignores any record that does not verify",
    ),
    Mutation(
        name="lan-unsigned-record-accepted",
        path="src/anywool/discovery/lan/_service.py",
        old="if signature is None or not hmac.compare_digest(",
        new="if signature is not None and not hmac.compare_digest(",
        tests=("tests/unit/test_lan_service.py",),
        why="README: with a secret, records are signed and unsigned ones ignored",
    ),
    # -- the runtime directory ---------------------------------------------------------------
    Mutation(
        name="runtime-dir-group-writable-accepted",
        path="src/anywool/_runtime_dir.py",
        old="if mode & 0o022:",
        new="if mode & 0o002:",
        tests=(f"{_LIMITS}::test_a_runtime_dir_writable_by_group_or_others_is_refused",),
        why="README: a 0700 directory refused if it is writable by others",
    ),
    Mutation(
        name="runtime-dir-other-writable-accepted",
        path="src/anywool/_runtime_dir.py",
        old="if mode & 0o022:",
        new="if mode & 0o020:",
        tests=(f"{_LIMITS}::test_a_runtime_dir_writable_by_group_or_others_is_refused",
               "tests/unit/test_registry.py::test_runtime_dir_writable_by_others_is_refused"),
        why="README: a 0700 directory refused if it is writable by others",
    ),
    Mutation(
        name="runtime-dir-not-narrowed",
        path="src/anywool/_runtime_dir.py",
        old="os.chmod(path, 0o700)",
        new="pass",
        tests=(f"{_LIMITS}::test_a_claim_narrows_a_readable_runtime_dir_to_0700",),
        why="README: the runtime directory is a 0700 directory",
    ),
    Mutation(
        name="runtime-dir-of-another-user-accepted",
        path="src/anywool/_runtime_dir.py",
        old="if info.st_uid != os.getuid():",
        new="if False:",
        tests=("tests/unit/test_registry.py::test_runtime_dir_of_another_user_is_refused",),
        why="README: refused if it belongs to another user",
    ),
    Mutation(
        name="runtime-dir-symlink-accepted",
        path="src/anywool/_runtime_dir.py",
        old="if stat.S_ISLNK(info.st_mode):",
        new="if False:",
        tests=("tests/unit/test_registry.py::test_runtime_dir_symlink_is_refused",),
        why="README: refused if it is a symlink",
    ),
    # -- frames: at most 64 MiB --------------------------------------------------------------
    Mutation(
        name="frame-limit-8-mib",
        path="src/anywool/runtime/wire/_frames.py",
        old="DEFAULT_MAX_FRAME_SIZE = 64 * 1024 * 1024",
        new="DEFAULT_MAX_FRAME_SIZE = 8 * 1024 * 1024",
        tests=(f"{_LIMITS}::test_a_frame_of_exactly_64_mib_crosses",),
        why="README: arguments and results travel in frames of at most 64 MiB (issue 21)",
    ),
    Mutation(
        name="frame-limit-65-mib",
        path="src/anywool/runtime/wire/_frames.py",
        old="DEFAULT_MAX_FRAME_SIZE = 64 * 1024 * 1024",
        new="DEFAULT_MAX_FRAME_SIZE = 65 * 1024 * 1024",
        tests=(f"{_LIMITS}::test_a_frame_one_byte_over_64_mib_is_neither_sent_nor_read",),
        why="README: frames of at most 64 MiB: a larger one raises",
    ),
    Mutation(
        name="frame-of-exactly-the-limit-not-sent",
        path="src/anywool/runtime/wire/_frames.py",
        old="    if length > max_frame_size:\n",
        new="    if length >= max_frame_size:\n",
        tests=(f"{_LIMITS}::test_a_frame_of_exactly_64_mib_crosses",),
        why="README: frames of at most 64 MiB: exactly 64 MiB is allowed",
    ),
    Mutation(
        name="frame-of-exactly-the-limit-not-read",
        path="src/anywool/runtime/wire/_frames.py",
        old="        if length > self._max:\n            raise FrameError(",
        new="        if length >= self._max:\n            raise FrameError(",
        tests=(f"{_LIMITS}::test_a_frame_of_exactly_64_mib_crosses",),
        why="README: frames of at most 64 MiB: exactly 64 MiB is allowed",
    ),
    Mutation(
        name="frame-over-the-limit-read",
        path="src/anywool/runtime/wire/_frames.py",
        old="        if length > self._max:\n            raise FrameError(",
        new="        if length > self._max + 1:\n            raise FrameError(",
        tests=(f"{_LIMITS}::test_a_frame_one_byte_over_64_mib_is_neither_sent_nor_read",),
        why="README: frames of at most 64 MiB (the receiver refuses a larger one unread)",
    ),
    Mutation(
        name="call-payload-over-the-limit-sent",
        path="src/anywool/runtime/client/_connection.py",
        old="        if size > limit:\n            raise PayloadTooLarge(f\"the call to {name}\"",
        new="        if size > limit + 1:\n            raise PayloadTooLarge(f\"the call to {name}\"",
        tests=("tests/integration/test_payloads.py::"
               "test_a_call_and_a_result_just_under_the_frame_limit_pass_and_just_over_do_not",),
        why="README: a larger call raises PayloadTooLarge at once",
    ),
    Mutation(
        name="result-payload-at-the-limit-refused",
        path="src/anywool/runtime/worker/_server.py",
        old="        if payload.nbytes <= limit:\n            await frames.send_parts(kind,",
        new="        if payload.nbytes < limit:\n            await frames.send_parts(kind,",
        tests=("tests/integration/test_payloads.py::"
               "test_a_call_and_a_result_just_under_the_frame_limit_pass_and_just_over_do_not",),
        why="README: results travel in frames of at most 64 MiB",
    ),
    # -- spawn is at most 1024 ---------------------------------------------------------------
    Mutation(
        name="spawn-1024-refused",
        path="src/anywool/_validate.py",
        old="if not lower <= value <= upper:",
        new="if not lower <= value < upper:",
        tests=(f"{_LIMITS}::test_spawn_of_1024_is_accepted_and_1025_refused",),
        why="README: spawn is at most 1024",
    ),
    Mutation(
        name="spawn-upper-bound-lowered",
        path="src/anywool/runtime/pool/_pool.py",
        old='_validate.count("spawn", spawn, upper=MAX_SPAWN)',
        new='_validate.count("spawn", spawn, upper=MAX_SPAWN - 1)',
        tests=(f"{_LIMITS}::test_spawn_of_1024_is_accepted_and_1025_refused",),
        why="README: spawn is at most 1024",
    ),
    Mutation(
        name="spawn-upper-bound-raised",
        path="src/anywool/runtime/pool/_pool.py",
        old="MAX_SPAWN = 1024",
        new="MAX_SPAWN = 1025",
        tests=(f"{_LIMITS}::test_spawn_of_1024_is_accepted_and_1025_refused",),
        why="README: spawn is at most 1024",
    ),
    Mutation(
        name="worker-command-workers-unbounded",
        path="src/anywool/cli/_worker_command.py",
        old="type=click.IntRange(min=1, max=MAX_SPAWN)",
        new="type=click.IntRange(min=1)",
        tests=(f"{_LIMITS}::test_the_worker_command_takes_1024_workers_and_refuses_1025",),
        why="README: spawn is at most 1024 (anywool worker --workers hosts a pool's workers)",
    ),
    # -- the local registry: 128 entries of at most 1024 bytes by default --------------------
    Mutation(
        name="registry-default-capacity-64",
        path="src/anywool/discovery/local/_local.py",
        old="capacity: int = 128,",
        new="capacity: int = 64,",
        tests=(f"{_LIMITS}::test_a_default_registry_holds_128_workers_and_refuses_the_129th",),
        why="README: a registry holds capacity workers (default 128)",
    ),
    Mutation(
        name="registry-default-capacity-129",
        path="src/anywool/discovery/local/_local.py",
        old="capacity: int = 128,",
        new="capacity: int = 129,",
        tests=(f"{_LIMITS}::test_a_default_registry_holds_128_workers_and_refuses_the_129th",),
        why="README: a registry holds capacity workers (default 128)",
    ),
    Mutation(
        name="registry-default-block-size-512",
        path="src/anywool/discovery/local/_local.py",
        old="block_size: int = 1024,",
        new="block_size: int = 512,",
        tests=(f"{_LIMITS}::test_a_default_registry_takes_metadata_of_1024_bytes_and_refuses_1025",),
        why="README: at most block_size bytes of encoded metadata each (default 1024)",
    ),
    Mutation(
        name="registry-default-block-size-1025",
        path="src/anywool/discovery/local/_local.py",
        old="block_size: int = 1024,",
        new="block_size: int = 1025,",
        tests=(f"{_LIMITS}::test_a_default_registry_takes_metadata_of_1024_bytes_and_refuses_1025",),
        why="README: at most block_size bytes of encoded metadata each (default 1024)",
    ),
    Mutation(
        name="registry-full-one-slot-early",
        path="src/anywool/discovery/local/_binding.py",
        old="index = next((i for i, entry in enumerate(slots) if not entry[3]), None)",
        new="index = next((i for i, entry in enumerate(slots[:-1]) if not entry[3]), None)",
        tests=(f"{_LIMITS}::test_a_default_registry_holds_128_workers_and_refuses_the_129th",),
        why="README: a registry holds capacity workers",
    ),
    Mutation(
        name="registry-max-capacity-lowered",
        path="src/anywool/discovery/local/_layout.py",
        old="MAX_CAPACITY = 65_536",
        new="MAX_CAPACITY = 65_535",
        tests=(f"{_LIMITS}::test_registry_capacity_and_block_size_take_their_documented_ranges",),
        why="LocalDiscovery docstring: capacity 1 to 65 536",
    ),
    Mutation(
        name="registry-max-block-size-raised",
        path="src/anywool/discovery/local/_layout.py",
        old="MAX_BLOCK_SIZE = 512 << 10",
        new="MAX_BLOCK_SIZE = (512 << 10) + 1",
        tests=(f"{_LIMITS}::test_registry_capacity_and_block_size_take_their_documented_ranges",),
        why="LocalDiscovery docstring: block_size 1 to 512 KiB",
    ),
    # -- lease and max_concurrency: at most k -------------------------------------------------
    Mutation(
        name="proxy-lease-admits-one-more",
        path="src/anywool/runtime/client/_proxy.py",
        old="return borrowed >= self._lease",
        new="return borrowed > self._lease",
        tests=("tests/unit/test_proxy.py::"
               "test_a_lease_caps_the_admitted_workers_and_frees_a_place_on_drop",),
        why="README: lease=k admits at most k workers found through discovery",
    ),
    Mutation(
        name="worker-runs-one-over-its-bound",
        path="src/anywool/runtime/worker/_server.py",
        old="self.stop.in_flight < self.max_concurrency",
        new="self.stop.in_flight <= self.max_concurrency",
        tests=("tests/integration/test_admission.py::"
               "test_a_worker_at_its_bound_refuses_a_call_before_running_it",),
        why="README: max_concurrency bounds how many calls each worker runs at once",
    ),
    Mutation(
        name="pool-sends-one-over-the-bound",
        path="src/anywool/runtime/client/_connection.py",
        old="self._running >= self._limit",
        new="self._running > self._limit",
        tests=("tests/integration/test_admission.py::test_each_place_freed_wakes_one_waiting_call",
               "tests/integration/test_admission.py::"
               "test_calls_beyond_every_workers_bound_wait_for_room"),
        why="README: a pool never sends a worker more calls than its max_concurrency",
    ),
    # -- durations ---------------------------------------------------------------------------
    Mutation(
        name="a-week-refused",
        path="src/anywool/_validate.py",
        old="or (value == 0 and not allow_zero) or value > MAX_SECONDS:",
        new="or (value == 0 and not allow_zero) or value >= MAX_SECONDS:",
        tests=(f"{_LIMITS}::test_a_week_is_the_longest_duration_accepted",),
        why="LocalDiscovery and pool docstrings: durations of at most a week",
    ),
    Mutation(
        name="interval-floor-raised",
        path="src/anywool/_validate.py",
        old="MIN_INTERVAL = 0.01",
        new="MIN_INTERVAL = 0.02",
        tests=(f"{_LIMITS}::test_an_interval_of_0_01_seconds_is_accepted_and_less_refused",),
        why="LocalDiscovery docstring: poll_interval and reap_interval of 0.01 s to a week",
    ),
    Mutation(
        name="interval-floor-lowered",
        path="src/anywool/_validate.py",
        old="    if value < floor:",
        new="    if value < floor / 2:",
        tests=(f"{_LIMITS}::test_an_interval_of_0_01_seconds_is_accepted_and_less_refused",),
        why="LocalDiscovery docstring: poll_interval and reap_interval of 0.01 s to a week",
    ),
    # -- filters and tags exclude ------------------------------------------------------------
    Mutation(
        name="local-discovery-filter-ignored",
        path="src/anywool/discovery/local/_local.py",
        old="return self.subscribe(self._filter)",
        new="return self.subscribe(None)",
        tests=("tests/unit/test_local_discovery.py::"
               "test_the_filter_keeps_non_matching_workers_out_of_the_subscriber",),
        why="LocalDiscovery(filter=...): a predicate applied to subscriber (issue 21)",
    ),
    Mutation(
        name="local-discovery-subscribe-filter-ignored",
        path="src/anywool/discovery/local/_local.py",
        old="return subscription if filter is None else afilter(filter, subscription)",
        new="return subscription",
        tests=("tests/unit/test_shared_subscriptions.py::"
               "test_afilter_tracks_entry_and_exit_of_the_predicate",),
        why="LocalDiscovery.subscribe(filter): a subscription filtered by filter",
    ),
    Mutation(
        name="afilter-admits-everything",
        path="src/anywool/discovery/_filter.py",
        old='passes = event.type != "worker-dropped" and self.predicate(event.metadata)',
        new='passes = event.type != "worker-dropped"',
        tests=("tests/unit/test_shared_subscriptions.py::"
               "test_afilter_tracks_entry_and_exit_of_the_predicate",),
        why="README: afilter: a worker entering the filter is added, leaving it dropped",
    ),
    Mutation(
        name="pool-uri-admits-any-tag",
        path="src/anywool/runtime/client/_proxy.py",
        old="return not self.tags.isdisjoint(metadata.tags)",
        new="return True",
        tests=("tests/unit/test_proxy.py::"
               "test_a_pool_uri_proxy_admits_exactly_the_workers_sharing_a_tag",),
        why="README: the pool URI form admits the workers whose tags share one of the given ones",
    ),
    Mutation(
        name="proxy-tags-admit-everything",
        path="src/anywool/runtime/client/_proxy.py",
        old="return self._tags is None or self._tags <= metadata.tags",
        new="return True",
        tests=("tests/unit/test_proxy.py::"
               "test_a_proxy_with_tags_never_dispatches_to_a_worker_lacking_one",),
        why="README: a pool with tags dispatches only to workers carrying all of them (issue 21)",
    ),
    Mutation(
        name="proxy-tags-admit-any-of-them",
        path="src/anywool/runtime/client/_proxy.py",
        old="return self._tags is None or self._tags <= metadata.tags",
        new="return self._tags is None or not self._tags.isdisjoint(metadata.tags)",
        tests=("tests/unit/test_proxy.py::"
               "test_a_proxy_with_tags_never_dispatches_to_a_worker_lacking_one",),
        why="README: a pool with tags dispatches only to workers carrying ALL of them",
    ),
    Mutation(
        name="pool-tags-not-applied",
        path="src/anywool/runtime/pool/_pool.py",
        old="tags=self._tags or None,",
        new="tags=None,",
        tests=("tests/integration/test_pool.py::"
               "test_a_pool_with_tags_never_dispatches_to_a_found_worker_lacking_them",),
        why="README: a pool with tags dispatches only to workers carrying all of them, its own "
            "or found through discovery",
    ),
    Mutation(
        name="spawned-workers-lack-the-pool-tags",
        path="src/anywool/runtime/pool/_pool.py",
        old="tags = self._tags | ({namespace} if isinstance(namespace, str) else set())",
        new="tags = frozenset({namespace} if isinstance(namespace, str) else set())",
        tests=("tests/integration/test_pool.py::"
               "test_a_pool_with_tags_never_dispatches_to_a_found_worker_lacking_them",),
        why="README: spawned workers carry the pool's tags and its namespace as tags",
    ),
    Mutation(
        name="spawned-workers-lack-the-namespace-tag",
        path="src/anywool/runtime/pool/_pool.py",
        old="tags = self._tags | ({namespace} if isinstance(namespace, str) else set())",
        new="tags = self._tags",
        tests=("tests/integration/test_pool.py::"
               "test_a_pool_with_tags_never_dispatches_to_a_found_worker_lacking_them",),
        why="README: spawned workers carry the pool's tags and its namespace as tags",
    ),
]
