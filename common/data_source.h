// From the API's data-source messages (recal.v1.DataSource) to data specs
// (common/data_spec.h): the client shows a job's source as a spec, the server turns a
// source it has checked into the spec its data layer opens. One mapping for both.
#pragma once

#include <optional>

#include "common/data_spec.h"
#include "recal/v1/recal.pb.h"

namespace recal::data {

// The spec `source` stands for, field for field, without checks (the server checks the
// fields before it asks). std::nullopt for client_stream, no source, or a tensor file
// without a known format.
// An image folder's resize, crop, mean and std left unset (0, empty) are ImageNet's
// (FillImageNetDefaults).
std::optional<DataSpec> DataSpecOfSource(const v1::DataSource& source);

// `folder` with what it leaves unset filled in as DataSpecOfSource does: what the server
// checks and runs.
v1::ImageFolderSource WithImageNetDefaults(v1::ImageFolderSource folder);

}  // namespace recal::data
