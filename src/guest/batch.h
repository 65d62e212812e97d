// Relays inside the guest run as SCHED_BATCH.
//
// The thread of trybox-init that carries a command's output to the channel is woken each time
// the command writes. As SCHED_OTHER it preempted the program at every write: under TCG each
// switch of the one vCPU between the two costs about as much as the bytes themselves, and
// `head` writing 8 KiB at a time reached half the port's rate. A SCHED_BATCH thread does not
// preempt on wake-up; it runs when the program blocks (a full pipe or socket buffer), ends,
// or uses up its time slice, and then takes everything written meanwhile. Latency is not
// lost when the vCPU is otherwise idle: a woken thread then runs at once.
//
// Tried and not kept: the egress tunnel's upload relay and a forwarded port's relay as
// SCHED_BATCH moved nothing (egress_bench, 16 MiB: upload 13.0 -> 12.3-13.1 MB/s); what bounds
// them is elsewhere.
#pragma once

namespace trybox::guest {

// Puts the calling thread (and the threads it starts afterwards) in SCHED_BATCH. Call it after
// starting any program that must keep the normal policy: children inherit it. A failure is
// logged and otherwise ignored (the relay is merely slower). `what` names the relay in the log.
void RelayAsBatch(const char* what);

}  // namespace trybox::guest
