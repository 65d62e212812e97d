#include "util/sha256.h"

#include <fcntl.h>
#include <nettle/nettle-meta.h>

#include <memory>
#include <optional>
#include <vector>

#include "util/fd.h"
#include "util/utf8.h"

namespace trybox {
namespace {

// One running digest, by Nettle's table of hash functions. Nettle rather than OpenSSL: the
// CLI hashes (image recipes) and every command it runs paid about 3 ms to map libcrypto
// before main (docs/performance.md, "The CLI's start"); Nettle is a tenth of that and
// within 10% of OpenSSL's speed here (SHA-NI).
class Digest {
 public:
  explicit Digest(const nettle_hash& h)
      : h_(h), ctx_(new uint64_t[(h.context_size + sizeof(uint64_t) - 1) / sizeof(uint64_t)]) {
    h_.init(ctx_.get());
  }
  void Update(std::string_view data) {
    h_.update(ctx_.get(), data.size(), reinterpret_cast<const uint8_t*>(data.data()));
  }
  std::string HexDigest() {
    std::vector<uint8_t> md(h_.digest_size);
    h_.digest(ctx_.get(), md.size(), md.data());
    return HexEncode(std::string_view(reinterpret_cast<const char*>(md.data()), md.size()));
  }

 private:
  const nettle_hash& h_;
  std::unique_ptr<uint64_t[]> ctx_;  // aligned for any context Nettle defines
};

const nettle_hash& HashOf(GitObjectHash git) {
  return git == GitObjectHash::kSha256 ? nettle_sha256 : nettle_sha1;
}

std::string BlobHeader(uint64_t size) {
  std::string h = "blob " + std::to_string(size);
  h.push_back('\0');
  return h;
}

}  // namespace

Result<std::string> Sha256File(const std::string& path) {
  ASSIGN_OR_RETURN(FileDigests d, DigestFile(path, GitObjectHash::kNone, 0));
  return std::move(d.sha256);
}

Result<FileDigests> DigestFile(const std::string& path, GitObjectHash git, uint64_t size) {
  ASSIGN_OR_RETURN(UniqueFd fd, OpenFile(path, O_RDONLY));
  Digest sha(nettle_sha256);
  std::optional<Digest> blob;
  if (git != GitObjectHash::kNone) {
    blob.emplace(HashOf(git));
    blob->Update(BlobHeader(size));
  }
  // Not zeroed: a zeroed MiB is 256 page faults on every call, however small the file (a
  // manifest's 1.5 KiB took 4 ms here); read() touches only the pages it fills.
  constexpr size_t kChunk = 1 << 20;
  auto buf = std::make_unique_for_overwrite<char[]>(kChunk);
  uint64_t read = 0;
  for (;;) {
    ASSIGN_OR_RETURN(size_t n, ReadSome(fd.get(), buf.get(), kChunk));
    if (n == 0) break;
    read += n;
    sha.Update(std::string_view(buf.get(), n));
    if (blob) blob->Update(std::string_view(buf.get(), n));
  }
  FileDigests out;
  out.sha256 = sha.HexDigest();
  if (blob && read == size) out.git_blob = blob->HexDigest();
  return out;
}

std::string GitBlobId(std::string_view content, GitObjectHash git) {
  Digest d(HashOf(git));
  d.Update(BlobHeader(content.size()));
  d.Update(content);
  return d.HexDigest();
}

std::string Sha256Hex(std::string_view data) {
  Digest d(nettle_sha256);
  d.Update(data);
  return d.HexDigest();
}

}  // namespace trybox
