// Image recipes: the JSON file `trybox image build NAME -f RECIPE` reads (docs/images.md,
// "Recipes"). This is the parser, the canonical form and the hash; the build itself runs
// in a VM (cli/image_recipe.h). Nothing here executes anything.
//
// The parser is strict: an unknown key, a wrong type, a bad name or path is an
// InvalidArgument naming its JSON path ("$.steps[1].workdir: must be an absolute path").
// Thread-safety: plain functions over values.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "util/status.h"

namespace trybox::image {

struct RecipeStep {
  enum class Kind { kRun, kCopy };
  Kind kind = Kind::kRun;
  std::string run;                         // kRun: a shell command (sh -c)
  std::string workdir;                     // kRun: absolute; "" = the exec default
  std::map<std::string, std::string> env;  // kRun
  std::string copy;                        // kCopy: relative to the recipe's folder
  std::string to;                          // kCopy: absolute path in the image

  bool operator==(const RecipeStep&) const = default;
};

struct Recipe {
  std::string from;                        // base image name
  std::vector<std::string> packages;       // Debian package names
  std::vector<std::string> allow;          // egress HOST[:PORT] entries for the steps
  std::map<std::string, std::string> env;  // baked into the image
  std::vector<RecipeStep> steps;
  std::vector<std::string> check;  // shell commands that must pass in a fresh VM

  bool operator==(const Recipe&) const = default;
};

// Parses and validates recipe text.
Result<Recipe> ParseRecipe(std::string_view json);

// The canonical form: every top-level key present, keys sorted, step fields that are
// empty left out. ParseRecipe(RecipeToJson(r).dump()) == r.
nlohmann::json RecipeToJson(const Recipe& recipe);

// The host path a `copy` step reads: `rel` resolved (symlinks too) under `recipe_dir`.
// kInvalidArgument if it is absolute or resolves outside the folder; kNotFound if missing.
Result<std::string> ResolveCopySource(const std::string& recipe_dir, const std::string& rel);

// SHA-256 (hex) over the canonical recipe and the content of every copied file or tree
// (paths, types, modes, file bytes, link targets), in step order.
Result<std::string> RecipeSha256(const Recipe& recipe, const std::string& recipe_dir);

// What an image is, for the agent's system prompt: "Debian 12 (bookworm)" from the suite in
// its manifest (or its parent's), and the checks of the recipe it was built from, if any.
// Facts that cannot be read are left out ("Debian", no checks): this never fails.
struct ImageDescription {
  std::string distribution = "Debian";
  std::vector<std::string> checks;
};
ImageDescription DescribeImage(const std::string& images_root, const std::string& name);

// Names of the recipes that ship with trybox (images/NAME.json), and their text.
std::vector<std::string> BuiltinRecipeNames();
// kNotFound if `name` is not one of them.
Result<std::string> BuiltinRecipe(const std::string& name);

}  // namespace trybox::image
