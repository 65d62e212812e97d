// SHA-256 of files and strings (OpenSSL EVP), as lowercase hex.
#pragma once

#include <string>
#include <string_view>

#include "util/status.h"

namespace trybox {

Result<std::string> Sha256File(const std::string& path);
std::string Sha256Hex(std::string_view data);

}  // namespace trybox
