#include "util/sha256.h"

#include <fcntl.h>
#include <openssl/evp.h>

#include <memory>
#include <vector>

#include "util/fd.h"
#include "util/utf8.h"

namespace trybox {
namespace {

std::string ToHex(const unsigned char* d, unsigned len) {
  return HexEncode(std::string_view(reinterpret_cast<const char*>(d), len));
}

using CtxPtr = std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)>;

const EVP_MD* MdOf(GitObjectHash git) {
  return git == GitObjectHash::kSha256 ? EVP_sha256() : EVP_sha1();
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
  CtxPtr sha(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  if (!sha || EVP_DigestInit_ex(sha.get(), EVP_sha256(), nullptr) != 1) {
    return Internal("sha256: EVP init failed");
  }
  CtxPtr blob(nullptr, EVP_MD_CTX_free);
  if (git != GitObjectHash::kNone) {
    blob.reset(EVP_MD_CTX_new());
    if (!blob || EVP_DigestInit_ex(blob.get(), MdOf(git), nullptr) != 1) {
      return Internal("git blob id: EVP init failed");
    }
    const std::string header = BlobHeader(size);
    EVP_DigestUpdate(blob.get(), header.data(), header.size());
  }
  std::vector<char> buf(1 << 20);
  uint64_t read = 0;
  for (;;) {
    ASSIGN_OR_RETURN(size_t n, ReadSome(fd.get(), buf.data(), buf.size()));
    if (n == 0) break;
    read += n;
    EVP_DigestUpdate(sha.get(), buf.data(), n);
    if (blob) EVP_DigestUpdate(blob.get(), buf.data(), n);
  }
  FileDigests out;
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned len = 0;
  EVP_DigestFinal_ex(sha.get(), md, &len);
  out.sha256 = ToHex(md, len);
  if (blob) {
    EVP_DigestFinal_ex(blob.get(), md, &len);
    if (read == size) out.git_blob = ToHex(md, len);
  }
  return out;
}

std::string GitBlobId(std::string_view content, GitObjectHash git) {
  CtxPtr ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned len = 0;
  const std::string header = BlobHeader(content.size());
  if (!ctx || EVP_DigestInit_ex(ctx.get(), MdOf(git), nullptr) != 1 ||
      EVP_DigestUpdate(ctx.get(), header.data(), header.size()) != 1 ||
      EVP_DigestUpdate(ctx.get(), content.data(), content.size()) != 1 ||
      EVP_DigestFinal_ex(ctx.get(), md, &len) != 1) {
    return "";
  }
  return ToHex(md, len);
}

std::string Sha256Hex(std::string_view data) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned len = 0;
  EVP_Digest(data.data(), data.size(), md, &len, EVP_sha256(), nullptr);
  return ToHex(md, len);
}

}  // namespace trybox
