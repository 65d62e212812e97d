// Templates: one saved, booted VM per image and machine shape, from which new VMs are
// restored in milliseconds instead of booted in seconds (docs/templates.md).
//
// A template directory holds the guest's RAM as a file (`memory`), QEMU's device state
// (`state`), the disk layer the template booted with (`disk.qcow2`), an empty overlay on
// it that each clone copies (`clone.qcow2`), and `meta.json` with the key it was built
// for. The key hashes everything that must match for the saved state to fit a new QEMU:
// the image's manifest, QEMU's version, and QEMU's whole argv (devices, memory, cpus,
// accelerator, kernel and kernel command line). A template is never used across a
// mismatch: Get() rebuilds it and says why.
//
// A template is accepted only once it proved a working timer (docs/timekeeping.md): after
// it is built, a clone restored from it must see its timer interrupts rise and a `sleep`
// return within a bound (the Prover, given by the caller, which knows how to restore and
// run a clone). The proof is recorded in meta.json; a template without a passing one is
// never handed out, and one whose proof failed is `broken` (Describe) until it is rebuilt
// or removed.
//
// Thread-safe. Builds are serialised per shape; restores share the template with each
// other but never with a rebuild or a discard.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <shared_mutex>
#include <string>
#include <vector>

#include "util/fd.h"
#include "util/mutex.h"
#include "util/status.h"
#include "vmm/qemu.h"

namespace trybox::vmm {

// Free space a template build needs beyond its memory file: its disk layer, state and
// overlay (a few MiB for a fresh guest), with room to spare.
inline constexpr int64_t kTemplateSlackBytes = int64_t{128} << 20;
// Bytes an unprivileged writer may still allocate on the filesystem holding `path`
// (statvfs f_bavail * f_frsize).
Result<int64_t> FreeBytes(const std::string& path);

struct TemplateShape {
  std::string image_name;
  std::string image_dir;        // verified
  std::string manifest_sha256;  // of image_dir/manifest.json
  int memory_mib = 512;
  int cpus = 1;
  std::string accel = "tcg";
  std::string qemu = "qemu-system-x86_64";
  // QEMU runs as a uid of its own (the daemon is root): the template's disk then names
  // its backing file through an inherited fd, so such templates are not interchangeable
  // with the others.
  bool own_uid = false;
};

// The first line of `qemu --version`, cached per binary (path, size, mtime).
Result<std::string> QemuVersion(const std::string& qemu);

// sha256 over the inputs below; `inputs` is what meta.json records, to explain a mismatch.
struct TemplateKey {
  std::string hash;
  nlohmann::json inputs;
};
Result<TemplateKey> ComputeTemplateKey(const TemplateShape& shape);

// Why an existing template does not fit `key` ("" if it does), comparing recorded inputs.
std::string TemplateMismatch(const nlohmann::json& meta, const TemplateKey& key);

class TemplateStore {
 public:
  // Templates live under `root`; template VMs run in `run_dir/<id>` while they boot.
  TemplateStore(std::string root, std::string run_dir, std::chrono::milliseconds boot_timeout)
      : root_(std::move(root)), run_dir_(std::move(run_dir)), boot_timeout_(boot_timeout) {}

  // A usable template, held: while a Lease lives nobody rebuilds or removes it.
  struct Lease {
    std::string dir;
    int memory_fd = -1;     // the RAM as a sealed memfd; owned by the store
    bool built = false;     // built by this call
    std::string built_why;  // why it had to be built
    double build_ms = 0;
    std::shared_lock<std::shared_mutex> hold;
  };
  // How a template VM is confined while it boots (egress layer 1, as for every VM).
  struct Sandbox {
    bool netns = true;
    std::optional<uid_t> uid;  // set iff shape.own_uid
  };
  // What a caller is told before a step that may take seconds: ("template", words) before
  // a build, ("memory", words) before the template's RAM is first loaded into a memfd.
  using Progress = std::function<void(const std::string& stage, const std::string& message)>;
  // Proves a freshly built template in `dir` (its RAM in `memory_fd`) by restoring a clone
  // and checking its timer: what was measured, or why it failed. Called with the template's
  // exclusive lock held.
  using Prover = std::function<Result<nlohmann::json>(const std::string& dir, int memory_fd)>;
  // Returns the valid template for `shape`, building and proving it first when there is
  // none, the one on disk does not match (image, QEMU, argv) or never proved its timer.
  // kUnavailable etc. if the build or the proof fails (a template that failed its proof
  // stays on disk, marked broken, for `image ls` and doctor to show).
  Result<Lease> Get(const TemplateShape& shape, const Sandbox& sandbox, const Prover& prove,
                    const Progress& progress = {});

  // Removes a template that failed to restore, so that the next Get rebuilds it. Call
  // without holding a Lease on it.
  void Discard(const TemplateShape& shape, const std::string& why);

  // Removes every template of image `image_name` (any shape) under the root: the names of
  // the directories removed. Call without holding a Lease on them.
  std::vector<std::string> RemoveImageTemplates(const std::string& image_name);

  // For doctor and `image ls`: {"state": "valid"|"stale"|"broken"|"none", "reason", "dir",
  // "timer"?...}. "broken": it failed its timer proof (reason says how).
  nlohmann::json Describe(const TemplateShape& shape);

  // Directory of the template for `shape` (whether or not it exists).
  std::string DirFor(const TemplateShape& shape) const;

 private:
  std::shared_mutex& LockFor(const std::string& dir);
  // The sealed memfd holding dir/memory for `key`, loaded on first use. Caller holds the
  // template's lock (shared or exclusive).
  Result<int> MemoryFd(const std::string& dir, const std::string& key, const Progress& progress);
  void Forget(const std::string& dir);
  // With the exclusive lock held: "" if the template in `dir` fits `key`, else why not.
  std::string Check(const std::string& dir, const TemplateKey& key, int memory_mib);
  // Runs `prove` on the template just built in `dir` and records the result in its
  // meta.json. Exclusive lock held.
  Status Prove(const std::string& dir, const std::string& key, const Prover& prove);
  Status Build(const TemplateShape& shape, const Sandbox& sandbox, const TemplateKey& key,
               const std::string& dir, double* build_ms);

  const std::string root_;
  const std::string run_dir_;
  const std::chrono::milliseconds boot_timeout_;
  Mutex mu_;
  std::map<std::string, std::unique_ptr<std::shared_mutex>> locks_ GUARDED_BY(mu_);
  struct Memory {
    std::string key;
    UniqueFd fd;
  };
  std::map<std::string, Memory> memory_ GUARDED_BY(mu_);  // by dir
};

// What doctor and `image ls` show: the template of the default shape (kDefaultMemoryMib,
// one cpu) of a valid image, under `templates_root`.
nlohmann::json DescribeImageTemplate(const std::string& templates_root,
                                     const std::string& image_name, const std::string& image_dir,
                                     const std::string& accel, const std::string& qemu,
                                     bool own_uid);

}  // namespace trybox::vmm
