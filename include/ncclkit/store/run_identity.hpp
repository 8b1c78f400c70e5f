#pragma once
/// Which job a process belongs to, as far as its environment says: a FileStore joins only runs
/// of the same job, so two jobs that share a rendezvous folder (at the same time, by mistake)
/// never complete their rendezvous with each other's processes.
///
/// First found wins:
///   1. NCCLKIT_RUN_ID: set by the user; the tag is its value as given.
///   2. NCCLKIT_LAUNCH_RUN_ID: set by ncclkit-run for its workers (one value for the whole
///      job, agreed by the launchers of every node).
///   3. TORCHELASTIC_RUN_ID: torchrun's run id (--rdzv-id; a random one with --standalone).
///      "none", torchrun's default without --rdzv-id, is shared by every such job: ignored.
///   4. SLURM_JOB_ID, without the step: the processes of one job may run in different steps
///      (one `srun -n1` per rank; mpirun under sbatch, whose head-node processes are in the
///      batch step and the others in an srun step), and they must meet. Steps run one after
///      another are kept apart by the removal of dead runs; steps of one job that run side by
///      side in one folder need NCCLKIT_RUN_ID.
/// None found: no identity (the empty tag), as before identities existed.

#include <string>  // std::string

#include "ncclkit/core/env.hpp"    // env_string (the launchers' variables)
#include "ncclkit/core/knobs.hpp"  // NCCLKIT_RUN_ID, NCCLKIT_LAUNCH_RUN_ID

namespace ncclkit {

/// The variable ncclkit-run sets for its workers: the job's id, one value on every node.
inline constexpr const char* kLaunchRunIdVariable = knob("NCCLKIT_LAUNCH_RUN_ID").name.data();

/// A job identity: what runs are matched by, and where it came from (for messages).
struct RunIdentity {
  std::string tag;     ///< empty: no identity found
  std::string source;  ///< "SLURM_JOB_ID=77"; empty with the tag
};

/// The identity the environment gives this process (see the top of this file).
inline RunIdentity run_identity_from_environment() {
  if (auto explicit_id = knob_text(knob("NCCLKIT_RUN_ID"))) return {*explicit_id, "NCCLKIT_RUN_ID=" + *explicit_id};
  if (auto launch = knob_text(knob("NCCLKIT_LAUNCH_RUN_ID"))) {
    return {"ncclkit-run:" + *launch, std::string(kLaunchRunIdVariable) + "=" + *launch + " (set by ncclkit-run)"};
  }
  if (auto torchrun = env_string("TORCHELASTIC_RUN_ID"); torchrun && *torchrun != "none") {
    return {"torchrun:" + *torchrun, "TORCHELASTIC_RUN_ID=" + *torchrun + " (set by torchrun)"};
  }
  if (auto job = env_string("SLURM_JOB_ID")) return {"slurm:" + *job, "SLURM_JOB_ID=" + *job};
  return {};
}

}  // namespace ncclkit
