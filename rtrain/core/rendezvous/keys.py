"""StoreKeys: where a job keeps its state on the rendezvous store.

A job's keys live under /rtrain/<run_id>/. Generations are rounds:

  round                    the open round (generation) number, advanced by compare_set
  r<g>/joins               counter: each joining agent takes a slot with add(1)
  r<g>/slot<k>             the MemberInfo of the agent holding slot k (1-based)
  r<g>/closed              the final membership (compressed JSON), written once
  r<g>/master              host:port of this generation's worker store
  r<g>/fail/<node>/<n>     FailureRecords of this generation
  r<g>/restart_claim       counter: the first agent to report a failure in <g> takes 1
                           and is the one charged a restart
  r<g>/done                counter of nodes whose workers all succeeded
  r<g>/exited              counter of nodes that saw every node done and are leaving
  r<g>/lease/<node>        the node's lease: a counter its agent renews every heartbeat
  r<g>/lost/<node>         the node rank of the agent that found <node>'s lease expired
                           (then a token of its call: a second call is no first)
  r<g>/inv/<node>          the shards <node> holds and the steps its workers reached
  r<g>/shards/<node>       host:port of <node>'s shard server
  r<g>/restored/<a>/<node> attempt <a> of the restore: complete or not, bad copies
  r<g>/status/<node>       the node's status record for `rtrain status` (core/observe)
  r<g>/snap_want/<node>    the snapshot interval <node> wants (the adapt policy; once a
                           change, core/snapshots/interval.py)
  r<g>/snap_interval       the job's snapshot interval schedule (JSON), compare-and-set
  r<g>/pace/<node>         <node>'s ranks' cumulative pace figures (core/pace/figures.py)
  r<g>/stragglers          node 0's verdict: the slow ranks now (core/pace/figures.py)
  secret                   the job's shard secret, when none was given to the agents
  r<g>/charged             the claim of <g>'s one root-cause charge (its closer, a token)
  r<g>/charge/<addr>       the claim of the one charge <addr> may take for <g>
  node_failures/<addr>     counter of failures charged to the node at <addr> (flapping)
  node_charges/<addr>/<n>  what its n-th charge was for ("lost in generation 3")
  r<g>/repair_failed       counter: the first node whose repair in place of <g> failed
                           takes 1 and counts it (once per generation, not per node)
  repair_failures          counter of the job's failed repairs in place
  repair_failures/<n>      the generation of the n-th
  repair_fallback          written by the node that counted the FALLBACK_AFTER-th: no
                           node repairs in place from then on (agent/repair/)
  r<g>/kept/<node>         the ranks of generation <g> whose processes node <node> kept
                           alive through a repair in place, "0,2" ("": none)
  fault_history            the nodes' fault history (core/rendezvous/fault_history.py),
                           seeded from --checkpoint-dir's file, appended by compare_set
  probe/<addr>             port of <addr>'s state-network probe listener (agent/net)
  abort                    an AbortRecord: the whole job stops
  abort_acks               counter of agents that read the abort record
"""

from __future__ import annotations


class StoreKeys:
    def __init__(self, run_id: str) -> None:
        self.prefix = f"/rtrain/{run_id}"

    @property
    def round(self) -> str:
        return f"{self.prefix}/round"

    @property
    def abort(self) -> str:
        return f"{self.prefix}/abort"

    def joins(self, generation: int) -> str:
        return f"{self.prefix}/r{generation}/joins"

    def slot(self, generation: int, slot: int) -> str:
        return f"{self.prefix}/r{generation}/slot{slot}"

    def closed(self, generation: int) -> str:
        return f"{self.prefix}/r{generation}/closed"

    def news(self, generation: int) -> str:
        """Set once something needs the running generation's members to look: the round
        moved past it, the job was aborted, a node waits to be admitted. They wait on this
        one key instead of polling each of those."""
        return f"{self.prefix}/r{generation}/news"

    def master(self, generation: int) -> str:
        return f"{self.prefix}/r{generation}/master"

    def failure(self, generation: int, node_rank: int, index: int) -> str:
        return f"{self.prefix}/r{generation}/fail/{node_rank}/{index}"

    def failure_count(self, generation: int, node_rank: int) -> str:
        return f"{self.prefix}/r{generation}/fail/{node_rank}/count"

    def reporters_count(self, generation: int) -> str:
        """How many entries the list of nodes with failure records has."""
        return f"{self.prefix}/r{generation}/reporters"

    def reporter(self, generation: int, index: int) -> str:
        return f"{self.prefix}/r{generation}/reporters/{index}"

    def restart_claim(self, generation: int) -> str:
        return f"{self.prefix}/r{generation}/restart_claim"

    def kept(self, generation: int, node_rank: int) -> str:
        return f"{self.prefix}/r{generation}/kept/{node_rank}"

    def done(self, generation: int) -> str:
        return f"{self.prefix}/r{generation}/done"

    def exited(self, generation: int) -> str:
        return f"{self.prefix}/r{generation}/exited"

    def repair_failed(self, generation: int) -> str:
        return f"{self.prefix}/r{generation}/repair_failed"

    @property
    def repair_failures(self) -> str:
        return f"{self.prefix}/repair_failures"

    def repair_failure(self, index: int) -> str:
        return f"{self.prefix}/repair_failures/{index}"

    @property
    def repair_fallback(self) -> str:
        return f"{self.prefix}/repair_fallback"

    @property
    def abort_acks(self) -> str:
        return f"{self.prefix}/abort_acks"

    def lease(self, generation: int, node_rank: int) -> str:
        return f"{self.lease_prefix(generation)}{node_rank}"

    def lease_prefix(self, generation: int) -> str:
        """Every lease key of the generation starts with this."""
        return f"{self.prefix}/r{generation}/lease/"

    def lost(self, generation: int, node_rank: int) -> str:
        return f"{self.prefix}/r{generation}/lost/{node_rank}"

    def lost_count(self, generation: int) -> str:
        """How many entries the generation's list of lost nodes has."""
        return f"{self.prefix}/r{generation}/lost_list"

    def lost_entry(self, generation: int, index: int) -> str:
        """Entry index (from 1) of that list: a node rank."""
        return f"{self.prefix}/r{generation}/lost_list/{index}"

    def inventory(self, generation: int, node_rank: int) -> str:
        return f"{self.prefix}/r{generation}/inv/{node_rank}"

    def shards(self, generation: int, node_rank: int) -> str:
        return f"{self.prefix}/r{generation}/shards/{node_rank}"

    def restore_outcome(self, generation: int, node_rank: int, attempt: int) -> str:
        return f"{self.prefix}/r{generation}/restored/{attempt}/{node_rank}"

    def status(self, generation: int, node_rank: int) -> str:
        return f"{self.prefix}/r{generation}/status/{node_rank}"

    def snapshot_want(self, generation: int, node_rank: int) -> str:
        return f"{self.prefix}/r{generation}/snap_want/{node_rank}"

    def snapshot_schedule(self, generation: int) -> str:
        return f"{self.prefix}/r{generation}/snap_interval"

    def pace(self, generation: int, node_rank: int) -> str:
        return f"{self.prefix}/r{generation}/pace/{node_rank}"

    def stragglers(self, generation: int) -> str:
        return f"{self.prefix}/r{generation}/stragglers"

    @property
    def secret(self) -> str:
        return f"{self.prefix}/secret"

    def charged(self, generation: int) -> str:
        return f"{self.prefix}/r{generation}/charged"

    def recycle_positions(self, generation: int) -> str:
        return f"{self.prefix}/r{generation}/recycle_positions"

    def charge_claim(self, generation: int, addr: str) -> str:
        return f"{self.prefix}/r{generation}/charge/{addr}"

    def node_failures(self, addr: str) -> str:
        return f"{self.prefix}/node_failures/{addr}"

    def node_charge(self, addr: str, index: int) -> str:
        return f"{self.prefix}/node_charges/{addr}/{index}"

    @property
    def failed_addrs_count(self) -> str:
        """How many entries the list of addresses ever charged a failure has."""
        return f"{self.prefix}/failed_addrs"

    def failed_addr(self, index: int) -> str:
        return f"{self.prefix}/failed_addrs/{index}"

    @property
    def fault_history(self) -> str:
        return f"{self.prefix}/fault_history"

    def net_probe(self, addr: str) -> str:
        return f"{self.prefix}/probe/{addr}"
