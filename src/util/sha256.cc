#include "util/sha256.h"

#include <fcntl.h>
#include <openssl/evp.h>

#include <memory>
#include <vector>

#include "util/fd.h"

namespace trybox {
namespace {

std::string ToHex(const unsigned char* d, unsigned len) {
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned i = 0; i < len; ++i) {
    out += kHex[d[i] >> 4];
    out += kHex[d[i] & 15];
  }
  return out;
}

using CtxPtr = std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)>;

}  // namespace

Result<std::string> Sha256File(const std::string& path) {
  ASSIGN_OR_RETURN(UniqueFd fd, OpenFile(path, O_RDONLY));
  CtxPtr ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  if (!ctx || EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1) {
    return Internal("sha256: EVP init failed");
  }
  std::vector<char> buf(1 << 20);
  for (;;) {
    ASSIGN_OR_RETURN(size_t n, ReadSome(fd.get(), buf.data(), buf.size()));
    if (n == 0) break;
    EVP_DigestUpdate(ctx.get(), buf.data(), n);
  }
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned len = 0;
  EVP_DigestFinal_ex(ctx.get(), md, &len);
  return ToHex(md, len);
}

std::string Sha256Hex(std::string_view data) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned len = 0;
  EVP_Digest(data.data(), data.size(), md, &len, EVP_sha256(), nullptr);
  return ToHex(md, len);
}

}  // namespace trybox
