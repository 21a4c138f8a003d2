// recalctl as a user runs it: a subprocess, its stdout parsed (text lines or protobuf
// JSON), its exit codes, against the real recal-server.
#include <gmock/gmock.h>
#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/sha256.h"
#include "recal/v1/recal.pb.h"
#include "tests/client/client_test_util.h"
#include "tests/client/sample_report.h"

namespace recal::testing {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;
namespace fs = std::filesystem;

// The one JSON document on stdout, as `Message`.
template <typename Message>
Message Parse(const Result& result) {
  Message message;
  const auto status = google::protobuf::util::JsonStringToMessage(result.out, &message);
  EXPECT_TRUE(status.ok()) << status << "\nstdout:\n" << result.out << "\nstderr:\n" << result.err;
  return message;
}

// The value of a "key: value" line of the text output.
std::string Field(const std::string& text, const std::string& key) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::StartsWith(line, key + ": ")) return std::string(line.substr(key.size() + 2));
  }
  return "";
}

TEST(RecalctlUsageTest, BadUsageExitsWith2AndHelpDocumentsTheExitCodes) {
  const Result help = Recalctl({"--help"});
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_THAT(help.out, HasSubstr("3 server unreachable"));
  EXPECT_THAT(help.out, HasSubstr("6 job cancelled"));
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {},
           {"frobnicate"},
           {"get"},
           {"get", "a", "b"},
           {"get", "x", "--bogus"},
           {"get", "x", "--data=npy:x"},  // a flag of another command
           {"list", "--output=xml"},
           {"download", "job"},              // no -o
           {"run", "m.pt", "-o", "out.pt"},  // no --data
           {"run", "m.pt", "--data", "bogus:x", "-o", "out.pt"},
           {"submit", "--model", "m", "--data", "npy:x", "--batch_size", "eight"},
           {"submit", "--model", "m", "--data", "npy:x", "--estimator", "median"},
           {"submit", "--model", "m", "--data", "npy:x", "--scale", "255"},  // not --stream
           {"submit", "--model", "m", "--data", "images:d?resize=4&crop=8&mean=0,0,0&std=1,1,1"},
           {"submit", "--model", "m", "--data", "images:d?resize=4&crop=4&mean=0,0,0&std=1,1,1", "--stream"},
           {"submit", "--model", "m", "--data", "npy:x?scale=255", "--stream", "--scale", "255"},  // twice
           {"list", "--state", "sleeping"},
       }) {
    const Result r = Recalctl(args);
    EXPECT_EQ(r.exit_code, 2) << absl::StrJoin(args, " ") << "\n" << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
    EXPECT_THAT(r.err, HasSubstr("recalctl --help"));
  }
}

TEST(RecalctlUsageTest, MistypedCommandsAndFlagsNameTheNearestAndVersionSaysWhatRuns) {
  const Result command = Recalctl({"lst"});
  EXPECT_EQ(command.exit_code, 2);
  EXPECT_THAT(command.err, HasSubstr("unknown command 'lst'; did you mean list?"));
  const Result flag = Recalctl({"list", "--stat=queued"});
  EXPECT_EQ(flag.exit_code, 2);
  EXPECT_THAT(flag.err, HasSubstr("unknown flag '--stat=queued'; did you mean --state?"));
  const Result far = Recalctl({"list", "--frobnicate"});
  EXPECT_THAT(far.err, Not(HasSubstr("did you mean")));
  // --version answers with no server too (and says none answered).
  const Result version = Recalctl({"--version", "--server=127.0.0.1:" + std::to_string(ClosedPort())});
  EXPECT_EQ(version.exit_code, 0) << version.err;
  EXPECT_THAT(version.out, HasSubstr("recalctl "));
  EXPECT_THAT(version.out, HasSubstr("recal-server: "));
  EXPECT_THAT(Recalctl({"--help"}).out, HasSubstr("--version"));
}

TEST(RecalctlUsageTest, AnUnreachableServerExitsWith3) {
  // Each call spends ~1.5 s in retries: two cases are enough.
  const std::string port = std::to_string(ClosedPort());
  const Result get = Recalctl({"get", "job-1", "--output=json", "--server=127.0.0.1:" + port});
  EXPECT_EQ(get.exit_code, 3) << get.err;
  // Where it looked, where the address came from, and how to start a server or point elsewhere.
  EXPECT_THAT(get.err, HasSubstr("no recal-server answered at 127.0.0.1:" + port));
  EXPECT_THAT(get.err, HasSubstr("the address is from --server. Is recal-server running there? Start one with "
                                 "`recal-server --listen=127.0.0.1:" + port + "`"));
  EXPECT_THAT(get.err, HasSubstr("--server HOST:PORT or RECAL_SERVER=HOST:PORT"));
  EXPECT_TRUE(get.out.empty());
  // RECAL_SERVER is the default address.
  const Result health = Recalctl({"health"}, {"RECAL_SERVER=127.0.0.1:" + port});
  EXPECT_EQ(health.exit_code, 3) << health.err;
  EXPECT_THAT(health.err, HasSubstr("no recal-server answered at 127.0.0.1:" + port));
  EXPECT_THAT(health.err, HasSubstr("the address is from RECAL_SERVER"));
}

// What the server would refuse for its format is refused before any byte goes: with no
// server at all, the refusal is the file's, not the connection's.
TEST(RecalctlUsageTest, AStateDictIsRefusedBeforeItIsSent) {
  TempDir tmp;
  const std::string state_dict = tmp.File("weights.pt");
  // What torch.save(model.state_dict(), "weights.pt") writes: a zip of data.pkl and storages.
  ASSERT_EQ(std::system(("python3 -c \"import sys, zipfile; z = zipfile.ZipFile(sys.argv[1], 'w'); "
                         "z.writestr('weights/data.pkl', 'x'); z.writestr('weights/data/0', '0')\" " + state_dict)
                            .c_str()),
            0);
  const std::string closed = "--server=127.0.0.1:" + std::to_string(ClosedPort());
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"upload", state_dict, closed},
           {"run", state_dict, "--data", "npy:x.npy", "-o", tmp.File("out.pt"), closed}}) {
    const Result r = Recalctl(args);
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_THAT(r.err, HasSubstr(state_dict + ": a torch.save file (a state_dict or a pickled module), not a "
                                              "model program"));
    EXPECT_THAT(r.err, HasSubstr("torch.export.save(torch.export.export(model, example_inputs), 'model.pt2')"));
    EXPECT_THAT(r.err, HasSubstr("nothing was sent"));
    EXPECT_THAT(r.err, Not(HasSubstr("no recal-server answered")));
  }
}

// `token new` needs no server: none runs, and the settings for one are ignored.
TEST(RecalctlTokenTest, NewPrintsATokenAndTheAuthFileLineThatGrantsIt) {
  const std::vector<std::string> no_server = {"RECAL_SERVER=127.0.0.1:" + std::to_string(ClosedPort()),
                                              "RECAL_TLS_CA=/nonexistent/ca.pem"};
  const Result first = Recalctl({"token", "new", "--tenant", "team-a.prod_1", "--role", "submit"}, no_server);
  ASSERT_EQ(first.exit_code, 0) << first.err;
  const std::vector<std::string> lines = absl::StrSplit(first.out, '\n');
  ASSERT_EQ(lines.size(), 3u) << first.out;  // two lines, each ended by '\n'
  EXPECT_EQ(lines[2], "");
  const std::string& token = lines[0];
  ASSERT_TRUE(absl::StartsWith(token, "recal_")) << token;
  EXPECT_TRUE(IsSha256Hex(token.substr(6))) << "64 lowercase hex digits: " << token;
  EXPECT_EQ(lines[1], "token-sha256:" + Sha256Hex(token) + " tenant=team-a.prod_1 role=submit");

  const Result second = Recalctl({"token", "new", "--tenant", "team-a.prod_1", "--role", "submit"});
  ASSERT_EQ(second.exit_code, 0) << second.err;
  EXPECT_NE(second.out.substr(0, second.out.find('\n')), token);

  const std::string tenant(64, 'T');
  const Result json = Recalctl({"token", "new", "--tenant", tenant, "--role", "admin", "--output=json"});
  ASSERT_EQ(json.exit_code, 0) << json.err;
  const auto fields = Parse<google::protobuf::Struct>(json).fields();
  const std::string json_token = fields.at("token").string_value();
  EXPECT_TRUE(absl::StartsWith(json_token, "recal_") && IsSha256Hex(json_token.substr(6))) << json_token;
  EXPECT_EQ(fields.at("auth_line").string_value(),
            "token-sha256:" + Sha256Hex(json_token) + " tenant=" + tenant + " role=admin");
  EXPECT_EQ(fields.at("tenant").string_value(), tenant);
  EXPECT_EQ(fields.at("role").string_value(), "admin");
  EXPECT_EQ(fields.size(), 4u);
  EXPECT_EQ(Recalctl({"token", "new", "--tenant", "a", "--role", "read"}).exit_code, 0);
}

TEST(RecalctlTokenTest, BadTenantsAndRolesAreUsageErrors) {
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"token"},
           {"token", "new"},
           {"token", "new", "--role", "read"},
           {"token", "new", "--tenant", "a"},
           {"token", "old", "--tenant", "a", "--role", "read"},
           {"token", "new", "extra", "--tenant", "a", "--role", "read"},
           {"token", "new", "--tenant", "a", "--role", "root"},
           {"token", "new", "--tenant", "a", "--role", "Admin"},
           {"token", "new", "--tenant", "a", "--role", ""},
           {"token", "new", "--tenant", "", "--role", "read"},
           {"token", "new", "--tenant", "a/b", "--role", "read"},
           {"token", "new", "--tenant", "a b", "--role", "read"},
           {"token", "new", "--tenant", "t\xc3\xa4", "--role", "read"},
           {"token", "new", "--tenant", std::string(65, 't'), "--role", "read"},
           {"token", "new", "--tenant", "a", "--role", "read", "--model", "m"},
       }) {
    const Result r = Recalctl(args);
    EXPECT_EQ(r.exit_code, 2) << absl::StrJoin(args, " ") << "\n" << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
    EXPECT_THAT(r.err, HasSubstr("recalctl --help"));
  }
}

// The names of the table's rows, in order: the lines after the column header ("layer ...")
// up to the first empty line.
std::vector<std::string> TableRows(const std::string& text) {
  std::vector<std::string> names;
  bool in_table = false;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::StartsWith(line, "layer ")) {
      in_table = true;
    } else if (line.empty()) {
      if (in_table) break;
    } else if (in_table) {
      names.emplace_back(line.substr(0, line.find(' ')));
    }
  }
  return names;
}

// SampleReport as the server writes report files: proto field names, every field, 64-bit
// integers as strings.
std::string WriteSampleReport(const TempDir& dir) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  std::string json;
  EXPECT_TRUE(google::protobuf::util::MessageToJsonString(SampleReport(), &json, options).ok());
  EXPECT_THAT(json, HasSubstr("\"samples\": \"200\""));
  const std::string path = dir.File("report.json");
  WriteBytes(path, json);
  return path;
}

TEST(RecalctlReportTest, ReadsAReportFileSortsByMeanShiftAndCutsAtTop) {
  TempDir tmp;
  const std::string report = WriteSampleReport(tmp);
  const Result table = Recalctl({"report", "--from", report});
  ASSERT_EQ(table.exit_code, 0) << table.err;
  EXPECT_THAT(table.out, HasSubstr("layers:     20 recalibrated, 1 unused, 1 excluded\n"));
  const std::vector<std::string> rows = TableRows(table.out);
  ASSERT_EQ(rows.size(), 15u) << table.out;
  EXPECT_EQ(rows[0], "layer17.bn");
  EXPECT_EQ(rows[14], "layer15.bn");
  EXPECT_THAT(table.out, HasSubstr("flagged, not in the table above:"));

  // A file needs no server: settings that would fail a connection do not matter.
  const Result top = Recalctl({"report", "--from", report, "--top", "2", "--warn_rel_error", "0.1"},
                              {"RECAL_TLS_CA=/nonexistent/ca.pem"});
  ASSERT_EQ(top.exit_code, 0) << top.err;
  EXPECT_THAT(TableRows(top.out), ElementsAre("layer17.bn", "layer14.bn"));
  EXPECT_THAT(top.out, Not(HasSubstr("rel.err >")));  // layer5.bn's 9% is under 10%

  const Result all = Recalctl({"report", "--from", report, "--all"});
  ASSERT_EQ(all.exit_code, 0) << all.err;
  EXPECT_EQ(TableRows(all.out).size(), static_cast<size_t>(kSampleLayers));
  EXPECT_THAT(all.out, Not(HasSubstr("flagged, not in the table above")));

  const Result json = Recalctl({"report", "--from", report, "--output=json"});
  ASSERT_EQ(json.exit_code, 0) << json.err;
  EXPECT_THAT(json.out, HasSubstr("\"samples\": 200"));  // a number, not "200"
  EXPECT_THAT(json.out, HasSubstr("\"estimator\": \"BATCH_AVERAGE\""));
  EXPECT_EQ(Parse<v1::RunReport>(json).layers_size(), kSampleLayers);

  const std::string page = tmp.File("report.html");
  const Result html = Recalctl({"report", "--from", report, "--html", page});
  ASSERT_EQ(html.exit_code, 0) << html.err;
  EXPECT_EQ(html.out, "wrote: " + page + "\n");
  const std::string written = ReadBytes(page);
  EXPECT_THAT(written, HasSubstr("<svg class=\"plot\" id=\"var-ratio\""));
  EXPECT_THAT(written, HasSubstr("layer3.bn&lt;script&gt;"));
  EXPECT_THAT(written, Not(HasSubstr("<script")));
}

TEST(RecalctlReportTest, BadFlagsAndFilesSayWhatToDo) {
  TempDir tmp;
  const std::string report = WriteSampleReport(tmp);
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"report"},
           {"report", "job-1", "job-2"},
           {"report", "job-1", "--from", report},
           {"report", "--from", report, "--top", "0"},
           {"report", "--from", report, "--top", "3", "--all"},
           {"report", "--from", report, "--warn_rel_error", "-1"},
           {"report", "--from", report, "--batch_size", "8"},
       }) {
    const Result r = Recalctl(args);
    EXPECT_EQ(r.exit_code, 2) << absl::StrJoin(args, " ") << "\n" << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
  }
  const Result missing = Recalctl({"report", "--from", tmp.File("missing.json")});
  EXPECT_EQ(missing.exit_code, 4) << missing.err;
  EXPECT_THAT(missing.err, HasSubstr("missing.json"));
  WriteBytes(tmp.File("model.pt"), "PK\x03\x04 not json");
  const Result garbage = Recalctl({"report", "--from", tmp.File("model.pt")});
  EXPECT_EQ(garbage.exit_code, 1);
  EXPECT_THAT(garbage.err, HasSubstr("is not a RunReport in JSON"));
  EXPECT_THAT(garbage.err, HasSubstr("--artifact report"));
  EXPECT_TRUE(garbage.out.empty());
}

class RecalctlTest : public ServerTest {
 protected:
  Result Ctl(std::vector<std::string> args) {
    args.push_back("--server=" + target());
    return Recalctl(args, {"RECAL_TOKEN=" + server_->token()});
  }
};

TEST_F(RecalctlTest, EveryCommandInTextAndJson) {
  const Result health = Ctl({"health", "--output=json"});
  EXPECT_EQ(health.exit_code, 0);
  EXPECT_EQ(Parse<google::protobuf::Struct>(health).fields().at("status").string_value(), "SERVING");
  EXPECT_EQ(Ctl({"health"}).out, "SERVING\n");

  const Result upload =
      Ctl({"upload", kModel, "--name", "resnet", "--label", "team=vision", "--output=json"});
  ASSERT_EQ(upload.exit_code, 0) << upload.err;
  const v1::Model model = Parse<v1::Model>(upload);
  EXPECT_EQ(model.id(), "sha256:" + *Sha256OfFile(kModel));
  EXPECT_EQ(model.labels().at("team"), "vision");
  const Result again = Ctl({"upload", kModel});
  EXPECT_EQ(again.exit_code, 0);
  EXPECT_EQ(Field(again.out, "id"), model.id());
  EXPECT_THAT(again.err, HasSubstr("nothing sent"));

  const Result submit = Ctl({"submit", "--model", model.id(), "--data", "npy:data/resnet18.npy",
                             "--batch_size=8", "--output=json"});
  ASSERT_EQ(submit.exit_code, 0) << submit.err;
  const v1::Job job = Parse<v1::Job>(submit);
  EXPECT_FALSE(job.id().empty());
  EXPECT_EQ(job.spec().batch_size(), 8);
  EXPECT_EQ(job.spec().data().tensor_file().format(), v1::TensorFileSource::NPY);
  // The JSON mapping's default spelling: lowerCamelCase names, enums by name.
  EXPECT_THAT(submit.out, HasSubstr("\"modelId\""));
  EXPECT_THAT(submit.out, HasSubstr("\"state\": \""));

  const Result watch = Ctl({"watch", job.id(), "--output=json"});
  EXPECT_EQ(watch.exit_code, 0) << watch.err;
  EXPECT_EQ(Parse<v1::Job>(watch).state(), v1::SUCCEEDED);
  EXPECT_THAT(watch.out, HasSubstr("\"state\": \"SUCCEEDED\""));
  EXPECT_THAT(watch.err, HasSubstr("RUNNING"));  // progress went to stderr

  const Result get = Ctl({"get", job.id()});
  EXPECT_EQ(get.exit_code, 0);
  EXPECT_EQ(Field(get.out, "id"), job.id());
  EXPECT_EQ(Field(get.out, "state"), "SUCCEEDED");
  EXPECT_EQ(Field(get.out, "data"), "npy:data/resnet18.npy");

  const Result list = Ctl({"list", "--state", "succeeded", "--output=json"});
  EXPECT_EQ(list.exit_code, 0);
  const v1::ListJobsResponse jobs = Parse<v1::ListJobsResponse>(list);
  ASSERT_EQ(jobs.jobs_size(), 1);
  EXPECT_EQ(jobs.jobs(0).id(), job.id());
  EXPECT_THAT(Ctl({"list"}).out, HasSubstr(job.id()));
  EXPECT_EQ(Parse<v1::ListModelsResponse>(Ctl({"list", "--models", "--output=json"})).models_size(), 1);

  const std::string bn = tmp_.File("bn.safetensors");
  const Result download = Ctl({"download", job.id(), "-o", bn, "--artifact", "bn", "--output=json"});
  ASSERT_EQ(download.exit_code, 0) << download.err;
  const auto fields = Parse<google::protobuf::Struct>(download).fields();
  EXPECT_EQ(fields.at("sha256").string_value(), *Sha256OfFile(bn));
  EXPECT_EQ(fields.at("artifact").string_value(), "BN_BUFFERS");
  EXPECT_LE(WorstBnError(bn), 1e-5);

  const Result cancel = Ctl({"cancel", job.id(), "--output=json"});  // ended already: unchanged
  EXPECT_EQ(cancel.exit_code, 0);
  EXPECT_EQ(Parse<v1::Job>(cancel).state(), v1::SUCCEEDED);

  const Result usage = Ctl({"usage", "--output=json"});
  ASSERT_EQ(usage.exit_code, 0) << usage.err;
  const v1::Usage used = Parse<v1::Usage>(usage);
  EXPECT_EQ(used.models(), 1);
  EXPECT_GE(used.results(), 3);
  EXPECT_EQ(Field(Ctl({"usage"}).out, "models"), absl::StrCat("1 (", used.model_bytes(), " bytes)"));
  // A job id is a job: deleted with its results, which leave the usage; the model stays.
  const Result deleted = Ctl({"delete", job.id(), "--output=json"});
  ASSERT_EQ(deleted.exit_code, 0) << deleted.err;
  EXPECT_EQ(Parse<v1::DeleteJobResponse>(deleted).result_bytes(), used.result_bytes());
  EXPECT_THAT(deleted.err, HasSubstr("deleted job " + job.id()));
  EXPECT_EQ(Parse<v1::Usage>(Ctl({"usage", "--output=json"})).results(), 0);
  EXPECT_EQ(Ctl({"get", job.id()}).exit_code, 4);

  // Not found: 4, with the reason on stderr and nothing on stdout.
  for (const std::vector<std::string>& args :
       std::vector<std::vector<std::string>>{{"get", "job-nope"},
                                             {"watch", "job-nope"},
                                             {"cancel", "job-nope"},
                                             {"download", "job-nope", "-o", tmp_.File("x")},
                                             {"upload", tmp_.File("missing.pt")}}) {
    const Result r = Ctl(args);
    EXPECT_EQ(r.exit_code, 4) << absl::StrJoin(args, " ") << ": " << r.err;
    EXPECT_TRUE(r.out.empty());
  }
}

TEST_F(RecalctlTest, RefusedUploadsNameTheFileAndTheExportAndVersionNamesTheServer) {
  const std::string junk = tmp_.File("weights.pt");
  std::ofstream(junk, std::ios::binary) << "not a zip at all";
  const Result upload = Ctl({"upload", junk});
  EXPECT_NE(upload.exit_code, 0);
  EXPECT_THAT(upload.err, HasSubstr(junk + ": not a model archive (not a zip file"));  // refused before it is sent
  EXPECT_THAT(upload.err, HasSubstr("torch.export.save(torch.export.export(model, example_inputs)"));
  const Result version = Ctl({"--version"});
  EXPECT_EQ(version.exit_code, 0) << version.err;
  EXPECT_THAT(version.out, ::testing::MatchesRegex("recalctl .*\nrecal-server .* \\(LibTorch .*\\)\n"));
}

TEST_F(RecalctlTest, ModelsHaveNamesAndVersionsThatEveryCommandTakes) {
  // Two archives under one name: versions 1 and 2.
  const Result first = Ctl({"upload", kModel, "--name", "rn18"});
  ASSERT_EQ(first.exit_code, 0) << first.err;
  EXPECT_EQ(Field(first.out, "reference"), "rn18:1");
  const std::string second_path = kFixtures + "/models/resnet18.exported_eval.pt2";
  const Result second = Ctl({"upload", second_path, "--name", "rn18"});
  ASSERT_EQ(second.exit_code, 0) << second.err;
  EXPECT_EQ(Field(second.out, "reference"), "rn18:2");
  // The file's name when none is given.
  EXPECT_EQ(Field(Ctl({"upload", kFixtures + "/models/resnet18.scripted_eval.pt"}).out, "reference"),
            "resnet18.scripted_eval.pt:1");

  const Result listed = Ctl({"list", "--models", "--name", "rn18"});
  ASSERT_EQ(listed.exit_code, 0) << listed.err;
  EXPECT_LT(listed.out.find("rn18:2"), listed.out.find("rn18:1")) << listed.out;  // newest first
  EXPECT_THAT(listed.out, Not(HasSubstr("scripted_eval")));

  // A job by name runs the latest version; the job keeps the full digest.
  const Result submitted = Ctl({"submit", "--model", "rn18", "--data", "npy:data/resnet18.npy", "--output=json"});
  ASSERT_EQ(submitted.exit_code, 0) << submitted.err;
  EXPECT_EQ(Parse<v1::Job>(submitted).spec().model_id(), Field(second.out, "id"));
  ASSERT_EQ(Ctl({"watch", Parse<v1::Job>(submitted).id(), "-q"}).exit_code, 0);
  // By a digest prefix too, and delete by name:version.
  const std::string prefix = Field(first.out, "id").substr(0, 7 + 8);  // "sha256:" and 8 hex digits
  const Result deleted = Ctl({"delete", "rn18:1"});
  ASSERT_EQ(deleted.exit_code, 0) << deleted.err;
  EXPECT_THAT(deleted.err, HasSubstr("deleted rn18:1 (" + Field(first.out, "id") + ")"));
  EXPECT_EQ(Ctl({"delete", prefix}).exit_code, 4);  // gone: not found
  EXPECT_EQ(Ctl({"delete", "nobody"}).exit_code, 4);
}

// The first hour's rough edges (issue 48): a wrong token says where it came from; a stored
// model runs by name; bytes stored under another name say they keep it; a name's versions
// without --models; not found names the recalctl command; report --html prints the page's path.
TEST_F(RecalctlTest, ErrorsSayWhatToDoAndStoredModelsRunByName) {
  const std::string server = "--server=" + target();
  const Result flag = Recalctl({"list", server, "--token", "recal_wrong"});
  EXPECT_EQ(flag.exit_code, 1) << flag.err;
  EXPECT_THAT(flag.err, HasSubstr("unknown token; recalctl sent the token from --token:"));
  const Result env = Recalctl({"list", server}, {"RECAL_TOKEN=recal_wrong"});
  EXPECT_THAT(env.err, HasSubstr("unknown token; recalctl sent the token from RECAL_TOKEN (--token overrides it)"));
  EXPECT_THAT(Recalctl({"list", server}).err, HasSubstr("recalctl sent no token: give --token or set RECAL_TOKEN"));

  ASSERT_EQ(Ctl({"upload", kModel, "--name", "rn18"}).exit_code, 0);
  const Result renamed = Ctl({"upload", kModel, "--name", "other"});
  EXPECT_EQ(renamed.exit_code, 0) << renamed.err;
  EXPECT_EQ(Field(renamed.out, "reference"), "rn18:1");
  EXPECT_THAT(renamed.err, HasSubstr("stored already as rn18:1"));
  EXPECT_THAT(renamed.err, HasSubstr("so it was not named 'other'"));
  const Result versions = Ctl({"list", "--name", "rn18"});  // no --models needed
  EXPECT_EQ(versions.exit_code, 0) << versions.err;
  EXPECT_THAT(versions.out, HasSubstr("rn18:1"));

  const Result run = Ctl({"run", "rn18:1", "--data", "npy:data/resnet18.npy", "--batch_size", "8", "-o",
                          tmp_.File("out.pt")});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_THAT(run.err, HasSubstr("model rn18:1 is on the server already; upload skipped"));
  EXPECT_EQ(Field(run.out, "state"), "SUCCEEDED");
  const Result nothing = Ctl({"run", "nosuch", "--data", "npy:data/resnet18.npy", "-o", tmp_.File("x.pt")});
  EXPECT_EQ(nothing.exit_code, 4) << nothing.err;
  EXPECT_THAT(nothing.err, HasSubstr("no model named 'nosuch'"));
  EXPECT_THAT(nothing.err, HasSubstr("and 'nosuch' is no file here either (`recalctl list --models` lists them)"));
  EXPECT_THAT(Ctl({"submit", "--model", "nosuch", "--data", "npy:data/resnet18.npy"}).err,
              HasSubstr("(`recalctl list --models` lists them)"));
  EXPECT_THAT(Ctl({"get", "job-0000000000000000"}).err, HasSubstr("(`recalctl list` lists your jobs)"));

  const std::string job = Field(run.out, "id");
  const Result table = Ctl({"report", job});
  ASSERT_EQ(table.exit_code, 0) << table.err;
  EXPECT_THAT(table.out, HasSubstr("\nbatch size: 8\nbatches:    3\n"));
  const std::string page = tmp_.File("report.html");
  const Result html = Ctl({"report", job, "--html", page});
  ASSERT_EQ(html.exit_code, 0) << html.err;
  EXPECT_EQ(html.out, "wrote: " + page + "\n");  // the page holds the table
  EXPECT_THAT(ReadBytes(page), HasSubstr("<svg"));
}

TEST_F(RecalctlTest, RunEndToEndMatchesTheReference) {
  const std::string out = tmp_.File("out.pt"), bn = tmp_.File("bn.safetensors"),
                    report = tmp_.File("report.json");
  const Result run = Ctl({"run", kModel, "--data", "npy:data/resnet18.npy", "-o", out, "--bn_out", bn,
                          "--report", report, "--batch_size", "8", "--output=json"});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const v1::Job job = Parse<v1::Job>(run);
  EXPECT_EQ(job.state(), v1::SUCCEEDED);
  EXPECT_EQ(job.spec().model_id(), "sha256:" + *Sha256OfFile(kModel));
  EXPECT_LE(WorstBnError(bn), 1e-5);
  EXPECT_GT(fs::file_size(out), 1000000u);
  EXPECT_THAT(ReadBytes(report), HasSubstr("\"layers_recalibrated\": 20"));
  EXPECT_THAT(run.err, HasSubstr("SUCCEEDED"));

  EXPECT_THAT(run.err, HasSubstr("per layer: recalctl report " + job.id()));  // the summary says where to look
  // The job's report from the server reads as the file `run` downloaded.
  const Result from_server = Ctl({"report", job.id()});
  ASSERT_EQ(from_server.exit_code, 0) << from_server.err;
  EXPECT_THAT(from_server.out, HasSubstr("layers:     20 recalibrated, 0 unused, 0 excluded\n"));
  EXPECT_EQ(TableRows(from_server.out).size(), 15u) << from_server.out;
  const Result from_file = Ctl({"report", "--from", report});
  ASSERT_EQ(from_file.exit_code, 0) << from_file.err;
  EXPECT_EQ(from_server.out, from_file.out);
  const Result html = Ctl({"report", job.id(), "--html", tmp_.File("report.html")});
  ASSERT_EQ(html.exit_code, 0) << html.err;
  EXPECT_EQ(html.out, "wrote: " + tmp_.File("report.html") + "\n");
  // resnet18: every one of its 20 layers is a point of each curve.
  EXPECT_THAT(ReadBytes(tmp_.File("report.html")), HasSubstr("data-series=\"max\" data-points=\"20\""));
  const Result json = Ctl({"report", job.id(), "--output=json"});
  ASSERT_EQ(json.exit_code, 0) << json.err;
  EXPECT_THAT(json.out, HasSubstr("\"layersRecalibrated\": 20"));
  EXPECT_EQ(Ctl({"report", "job-nope"}).exit_code, 4);

  // --stream: a local file outside every data root goes through PushBatches.
  const std::string local = tmp_.File("local.npy");
  fs::copy_file(kFixtures + "/data/resnet18.npy", local);
  const std::string streamed_bn = tmp_.File("streamed.safetensors");
  const Result streamed = Ctl({"run", kModel, "--data", "npy:" + local, "--stream", "-o", tmp_.File("s.pt"),
                               "--bn_out", streamed_bn, "--batch_size", "8"});
  ASSERT_EQ(streamed.exit_code, 0) << streamed.err;
  EXPECT_EQ(Field(streamed.out, "state"), "SUCCEEDED");
  EXPECT_EQ(Field(streamed.out, "data"), "client_stream");
  EXPECT_THAT(streamed.err, HasSubstr("upload skipped"));
  EXPECT_THAT(streamed.err, HasSubstr("3/3 batches"));
  EXPECT_LE(WorstBnError(streamed_bn), 1e-5);
  // Without --stream the server refuses the same path: it lies outside its data roots.
  EXPECT_EQ(Ctl({"run", kModel, "--data", "npy:" + local, "-o", tmp_.File("r.pt"), "-q"}).exit_code, 1);
}

TEST_F(RecalctlTest, SubmitsImageFolders) {
  ASSERT_EQ(MakeImageFolders(tmp_.path()), 0);
  const Result upload = Ctl({"upload", kModel, "--output=json"});
  ASSERT_EQ(upload.exit_code, 0) << upload.err;
  const std::string model_id = Parse<v1::Model>(upload).id();
  const std::string spec =
      "images:with_bad?resize=36&crop=32&mean=0.485,0.456,0.406&std=0.229,0.224,0.225&on_bad=skip";
  const Result submit = Ctl({"submit", "--model", model_id, "--data", spec, "--batch_size", "3", "--output=json"});
  ASSERT_EQ(submit.exit_code, 0) << submit.err;
  const v1::Job job = Parse<v1::Job>(submit);
  EXPECT_EQ(job.spec().data().image_folder().path(), "with_bad");
  EXPECT_EQ(job.spec().data().image_folder().on_bad(), v1::ImageFolderSource::SKIP);
  EXPECT_THAT(submit.out, HasSubstr("\"onBad\": \"SKIP\""));
  const Result watch = Ctl({"watch", job.id()});
  EXPECT_EQ(watch.exit_code, 0) << watch.err;
  EXPECT_EQ(Field(watch.out, "state"), "SUCCEEDED");
  EXPECT_EQ(Field(watch.out, "data"), spec);

  // A folder outside the data roots: refused (1), nothing on stdout.
  const Result outside = Ctl({"submit", "--model", model_id, "--data",
                              "images:" + tmp_.File("outside/imgs") + "?resize=36&crop=32&mean=0,0,0&std=1,1,1"});
  EXPECT_EQ(outside.exit_code, 1) << outside.err;
  EXPECT_THAT(outside.err, HasSubstr("outside"));
  EXPECT_TRUE(outside.out.empty());
}

TEST_F(RecalctlTest, ComputeDtypeAndMemoryFormatReachTheWorkerAndTheReport) {
  const std::string report = tmp_.File("report.json"), bn = tmp_.File("bn.safetensors");
  const Result run = Ctl({"run", kModel, "--data", "npy:data/resnet18.npy", "-o", tmp_.File("out.pt"), "--bn_out",
                          bn, "--report", report, "--batch_size", "8", "--compute_dtype", "bfloat16",
                          "--memory_format", "channels_last", "--output=json"});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_EQ(Parse<v1::Job>(run).spec().options().compute_dtype(), "bfloat16");
  EXPECT_THAT(ReadBytes(report), HasSubstr("\"compute_dtype\": \"bfloat16\""));
  EXPECT_THAT(ReadBytes(report), HasSubstr("\"memory_format\": \"channels_last\""));
  // The statistics of a bfloat16 forward: near the float64 reference of the float32 model,
  // not at its 1e-5.
  const double error = WorstBnError(bn);
  EXPECT_GT(error, 1e-5);
  EXPECT_LT(error, 0.1);

  // Names outside the lists are refused at submit (1); float16 runs on a CPU worker too.
  const Result typo = Ctl({"submit", "--model", "sha256:" + *Sha256OfFile(kModel), "--data",
                           "npy:data/resnet18.npy", "--compute_dtype", "bf16"});
  EXPECT_EQ(typo.exit_code, 1) << typo.err;
  EXPECT_THAT(typo.err, HasSubstr("compute_dtype 'bf16'"));
  const Result half = Ctl({"run", kModel, "--data", "npy:data/resnet18.npy", "-o", tmp_.File("half.pt"),
                           "--batch_size", "8", "--compute_dtype", "float16"});
  EXPECT_EQ(half.exit_code, 0) << half.err;
}

TEST_F(RecalctlTest, FoldedOutDownloadsTheFoldedProgramAndTheReportSaysWhatWasFolded) {
  const std::string program = kFixtures + "/models/resnet18.exported_train.pt2";
  const std::string folded = tmp_.File("folded.pt2");
  const Result run = Ctl({"run", program, "--data", "npy:data/resnet18.npy", "-o", tmp_.File("out.pt2"),
                          "--folded_out", folded, "--batch_size", "8", "--output=json"});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const v1::Job job = Parse<v1::Job>(run);
  EXPECT_TRUE(job.spec().options().fold_batch_norm());
  EXPECT_THAT(ReadBytes(folded).substr(0, 2), "PK");
  const Result report = Ctl({"report", job.id()});
  ASSERT_EQ(report.exit_code, 0) << report.err;
  EXPECT_THAT(report.out, HasSubstr("folded 20 BatchNorm layers into the layers before them"));
  const Result again = Ctl({"download", job.id(), "--artifact", "folded", "-o", tmp_.File("again.pt2")});
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_EQ(ReadBytes(tmp_.File("again.pt2")), ReadBytes(folded));
  EXPECT_EQ(Ctl({"download", job.id(), "--artifact", "foldd", "-o", tmp_.File("x")}).exit_code, 2);
}

TEST_F(RecalctlTest, FailedAndCancelledJobsHaveTheirExitCodes) {
  const Result failed = Ctl({"run", kModel, "--data", "npy:data/bn1d_2d.npy", "-o", tmp_.File("out.pt"),
                             "--batch_size", "8", "--output=json"});
  EXPECT_EQ(failed.exit_code, 5) << failed.err;
  EXPECT_EQ(Parse<v1::Job>(failed).state(), v1::FAILED);
  EXPECT_THAT(failed.err, HasSubstr("forward failed"));
  EXPECT_FALSE(fs::exists(tmp_.File("out.pt")));

  const std::string model_id = "sha256:" + *Sha256OfFile(kModel);
  const Result submit = Ctl({"submit", "--model", model_id, "--data", "synthetic:3x64x64", "--max_batches",
                             "1000", "--batch_size", "16", "--output=json"});
  ASSERT_EQ(submit.exit_code, 0) << submit.err;
  const std::string id = Parse<v1::Job>(submit).id();
  EXPECT_EQ(Ctl({"cancel", id}).exit_code, 0);
  const Result watch = Ctl({"watch", id});
  EXPECT_EQ(watch.exit_code, 6) << watch.err;
  EXPECT_EQ(Field(watch.out, "state"), "CANCELLED");
  EXPECT_EQ(Ctl({"watch", Parse<v1::Job>(failed).id(), "-q"}).exit_code, 5);
}

}  // namespace
}  // namespace recal::testing
