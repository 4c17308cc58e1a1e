"""Issue 22's promises (EtcdDiscovery) broken one at a time: a test must fail for each."""

from mutate import Mutation

D = "tests/etcd/test_etcd_discovery.py"
F = "tests/etcd/test_etcd_failover.py"
S = "tests/etcd/test_etcd_security.py"
U = "tests/unit/test_etcd_config.py"

MUTATIONS: list[Mutation] = [
    Mutation(
        name="etcd-claim-keeps-a-dead-generations-workers",
        path="src/anywool/discovery/etcd/_etcd.py",
        old='"success": [{"request_delete_range": {"key": b64(keys.workers),',
        new='"success": [{"request_range": {"key": b64(keys.workers),',
        tests=(f"{D}::test_a_killed_owner_is_succeeded_and_live_subscriptions_follow",),
        why="a successor's namespace starts without the dead generation's workers",
    ),
    Mutation(
        name="etcd-writes-not-fenced-by-generation",
        path="src/anywool/discovery/etcd/_etcd.py",
        old='"create_revision": str(generation)}],',
        new='"create_revision": str(0)}], "_": str(generation),',
        tests=(f"{D}::test_a_displaced_owner_changes_nothing_of_its_successor",
               f"{D}::test_publish_update_drop_and_exit_withdraws"),
        why="README: a displaced owner's late writes change nothing of a successor's",
    ),
    Mutation(
        name="etcd-lease-renewed-too-rarely",
        path="src/anywool/discovery/etcd/_lease.py",
        old="interval = self.ttl / 3",
        new="interval = self.ttl * 1.5",
        tests=(f"{D}::test_a_killed_publishers_workers_leave_every_view",),
        why="leases are renewed every lease_ttl / 3 seconds",
    ),
    Mutation(
        name="etcd-lost-lease-not-noticed",
        path="src/anywool/discovery/etcd/_lease.py",
        old="if ttl > 0:",
        new="if True:",
        tests=(f"{D}::test_a_publisher_whose_lease_etcd_dropped_announces_its_workers_again",
               f"{D}::test_a_displaced_owner_changes_nothing_of_its_successor"),
        why="a keepalive answered without a TTL is a lost lease",
    ),
    Mutation(
        name="etcd-watch-skips-a-revision",
        path="src/anywool/discovery/etcd/_source.py",
        old='"start_revision": str(self.revision + 1)',
        new='"start_revision": str(self.revision + 2)',
        tests=(f"{D}::test_a_snapshot_then_every_change_in_order_without_gap_or_duplicate",
               f"{D}::test_publish_update_drop_and_exit_withdraws"),
        why="a snapshot at R then a watch from R + 1: no gap",
    ),
    Mutation(
        name="etcd-compaction-not-resynced",
        path="src/anywool/discovery/etcd/_source.py",
        old="await self._resync(gateway)",
        new="self.revision += 0",
        tests=(f"{D}::test_a_watch_behind_a_compaction_resyncs_with_the_net_difference",),
        why="after a compaction the net difference is reported",
    ),
    Mutation(
        name="etcd-watch-does-not-move-to-another-member",
        path="src/anywool/discovery/etcd/_source.py",
        old="            gateway.rotate()\n            failures += 1",
        new="            failures += 1",
        tests=(f"{F}::test_a_subscription_survives_the_leaders_death",),
        why="a subscription resumes on another member when its member dies",
    ),
    Mutation(
        name="etcd-silent-member-not-pinged",
        path="src/anywool/discovery/etcd/_source.py",
        old="await anyio.sleep(PING_INTERVAL)",
        new="await anyio.sleep(3600)",
        tests=(f"{F}::test_a_subscription_leaves_a_frozen_member",),
        why="a subscription leaves a frozen member within about 2 s",
    ),
    Mutation(
        name="etcd-owner-exit-unbounded",
        path="src/anywool/discovery/etcd/_etcd.py",
        old="            with anyio.move_on_after(self._teardown_timeout):\n                try:\n                    if generation",
        new="            with anyio.move_on_after(3600):\n                try:\n                    if generation",
        tests=(f"{D}::test_exits_keep_their_budget_when_etcd_is_frozen",),
        why="an owner's exit keeps to teardown_timeout when etcd is frozen",
    ),
    Mutation(
        name="etcd-publisher-exit-unbounded",
        path="src/anywool/discovery/etcd/_etcd.py",
        old="                with anyio.move_on_after(self.teardown_timeout):\n                    try:\n                        await _revoke(gateway, keeper.lease)",
        new="                with anyio.move_on_after(3600):\n                    try:\n                        await _revoke(gateway, keeper.lease)",
        tests=(f"{D}::test_exits_keep_their_budget_when_etcd_is_frozen",),
        why="a publisher's exit keeps to teardown_timeout when etcd is frozen",
    ),
    Mutation(
        name="etcd-publisher-exit-leaves-its-lease",
        path="src/anywool/discovery/etcd/_etcd.py",
        old="                        await _revoke(gateway, keeper.lease)",
        new="                        pass",
        tests=(f"{D}::test_publish_update_drop_and_exit_withdraws",),
        why="a publisher's exit withdraws its workers (one revocation)",
    ),
    Mutation(
        name="etcd-password-pickled",
        path="src/anywool/discovery/etcd/_etcd.py",
        old='"username": c.username,',
        new='"username": c.username, "password": config.password,',
        tests=(f"{U}::test_a_password_is_never_shown_nor_pickled",),
        why="a password never goes into a pickle",
    ),
    Mutation(
        name="etcd-whole-budget-for-every-member",
        path="src/anywool/discovery/etcd/_gateway.py",
        old="share = budget / len(order)",
        new="share = budget",
        tests=(f"{F}::test_a_frozen_member_costs_a_request_its_share_of_the_budget_only",),
        why="request_timeout is shared by the members tried",
    ),
    Mutation(
        name="etcd-cancelled-handshake-leaks",
        path="src/anywool/discovery/etcd/_gateway.py",
        old="transport=Transport(config.ssl_context(), limits),",
        new="verify=config.ssl_context(), limits=limits,",
        tests=(f"{S}::test_a_cancelled_tls_handshake_leaves_no_socket_behind",),
        why="no socket is left to the garbage collector",
    ),
    Mutation(
        name="etcd-borrowers-of-nothing-proceed",
        path="src/anywool/discovery/etcd/_etcd.py",
        old="    if not kvs:\n        raise DiscoveryNamespaceNotFound(namespace, _KIND)",
        new="    if not kvs:\n        return 0",
        tests=(f"{D}::test_borrowers_of_an_unowned_namespace_raise_and_create_nothing",),
        why="borrowers of an unowned namespace raise and create nothing",
    ),
]
