#include "tools/ibv-extend-perf/results.h"

#include <cstdio>

namespace ibvx::perf {

void Results::add(std::string section, std::string key, double value, std::string unit, std::string note) {
    for (Row &r : rows_) {
        if (r.section == section && r.key == key) {
            r.value = value;
            if (!note.empty()) {
                r.note = std::move(note);
            }
            return;
        }
    }
    rows_.push_back(Row{std::move(section), std::move(key), value, std::move(unit), std::move(note)});
}

const Row *Results::find(const std::string &section, const std::string &key) const {
    for (const Row &r : rows_) {
        if (r.section == section && r.key == key) {
            return &r;
        }
    }
    return nullptr;
}

nlohmann::json Results::toJson() const {
    nlohmann::json j = nlohmann::json::object();
    for (const Row &r : rows_) {
        j[r.section][r.key] = r.value;
    }
    j["machine"] = machine_;
    return j;
}

void Results::printTable(std::ostream &out) const {
    char line[256];
    std::snprintf(line, sizeof(line), "%-44s %14s  %-8s %s\n", "figure", "value", "unit", "note");
    out << line;
    for (const Row &r : rows_) {
        std::string name = r.section + "." + r.key;
        std::snprintf(line, sizeof(line), "%-44s %14.3f  %-8s %s\n", name.c_str(), r.value, r.unit.c_str(),
                      r.note.c_str());
        out << line;
    }
    for (auto &[k, v] : machine_.items()) {
        std::snprintf(line, sizeof(line), "%-44s %s\n", ("machine." + k).c_str(),
                      v.get<std::string>().c_str());
        out << line;
    }
}

void Results::printMarkdown(std::ostream &out) const {
    out << "| figure | value | unit | note |\n|---|---:|---|---|\n";
    char v[64];
    for (const Row &r : rows_) {
        std::snprintf(v, sizeof(v), "%.3f", r.value);
        out << "| `" << r.section << "." << r.key << "` | " << v << " | " << r.unit << " | " << r.note
            << " |\n";
    }
    for (auto &[k, val] : machine_.items()) {
        out << "| `machine." << k << "` | " << val.get<std::string>() << " | | |\n";
    }
}

}  // namespace ibvx::perf
