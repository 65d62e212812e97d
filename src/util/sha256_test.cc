#include "util/sha256.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>

namespace trybox {
namespace {

// Known answers: FIPS 180-2's "abc", and what `git hash-object` gives "hello\n" in a SHA-1
// and in a SHA-256 repository.
TEST(Sha256Test, KnownAnswers) {
  EXPECT_EQ(Sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(Sha256Hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(GitBlobId("hello\n", GitObjectHash::kSha1), "ce013625030ba8dba906f756967f9e9ca394464a");
  EXPECT_EQ(GitBlobId("hello\n", GitObjectHash::kSha256),
            "2cf8d83d9ee29543b34a87727421fdecb7e3f3a183d337639025de576db9ebb4");
}

TEST(Sha256Test, AFileReadInChunksHashesAsOneString) {
  char dir[] = "/tmp/sha256_test.XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  const std::string path = std::string(dir) + "/f";
  // Past the 1 MiB read buffer, so that the digest spans reads.
  std::string content;
  for (int i = 0; content.size() < (3u << 20) + 17; ++i) content += std::to_string(i) + ",";
  std::ofstream(path, std::ios::binary) << content;

  auto d = DigestFile(path, GitObjectHash::kSha1, content.size());
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->sha256, Sha256Hex(content));
  EXPECT_EQ(d->git_blob, GitBlobId(content, GitObjectHash::kSha1));
  auto only = Sha256File(path);
  ASSERT_TRUE(only.ok());
  EXPECT_EQ(*only, Sha256Hex(content));
  // A size that lstat gave before the file changed: no blob id rather than a wrong one.
  auto stale = DigestFile(path, GitObjectHash::kSha256, content.size() - 1);
  ASSERT_TRUE(stale.ok());
  EXPECT_EQ(stale->git_blob, "");
  EXPECT_FALSE(DigestFile(std::string(dir) + "/missing", GitObjectHash::kNone, 0).ok());
  ::unlink(path.c_str());
  ::rmdir(dir);
}

}  // namespace
}  // namespace trybox
