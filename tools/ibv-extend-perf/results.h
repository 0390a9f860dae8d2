// One benchmark run's figures: a flat list of (section.key, value, unit) rows kept in the order
// they were measured, printed as a table and written as the nested JSON object whose key names
// other tools read (see docs in README of this folder).
#pragma once

#include <nlohmann/json.hpp>

#include <ostream>
#include <string>
#include <vector>

namespace ibvx::perf {

struct Row {
    std::string section;  // "floors", "fastpath", ...
    std::string key;      // stable JSON key inside the section
    double value = 0;
    std::string unit;  // for the table only
    std::string note;  // for the table only
};

class Results {
  public:
    void add(std::string section, std::string key, double value, std::string unit, std::string note = {});
    // nullptr when absent.
    const Row *find(const std::string &section, const std::string &key) const;
    // section -> key -> value; strings for the "machine" section.
    nlohmann::json toJson() const;
    void printTable(std::ostream &out) const;
    // The same rows as a Markdown table (for docs/BENCHMARKS.md).
    void printMarkdown(std::ostream &out) const;
    void setMachine(const std::string &key, const std::string &value) { machine_[key] = value; }

  private:
    std::vector<Row> rows_;
    nlohmann::json machine_ = nlohmann::json::object();
};

}  // namespace ibvx::perf
